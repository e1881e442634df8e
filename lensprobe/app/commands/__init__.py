"""One module per ``lensprobe`` subcommand, each with an ``add_<name>(subparsers)`` function.

May import: everything in lensprobe below :mod:`lensprobe.app`, :mod:`lensprobe.app.common`, and the
demo (:mod:`lensprobe.app.demo`, :mod:`lensprobe.app.sections`); never another command.
"""
