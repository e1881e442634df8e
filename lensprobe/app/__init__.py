"""The application layer: the ``lensprobe`` command (:mod:`lensprobe.app.cli`, one module per
subcommand in :mod:`lensprobe.app.commands`, shared arguments in :mod:`lensprobe.app.common`)
and the demo report (:mod:`lensprobe.app.demo`, its sections in :mod:`lensprobe.app.sections`).
Thin: it parses, calls the library and writes files.

May import: everything else in lensprobe.
"""
