"""The demo report's sections, one module per study: ``build(model, *, quick) -> Section | list``.

May import: everything in lensprobe below :mod:`lensprobe.app` (sections compute with the
studies and draw with :mod:`lensprobe.viz`) and other sections; never a command.
"""
