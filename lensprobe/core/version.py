"""lensprobe's version, in a module of its own so that any part of the package can read it
without importing the top-level package (which imports everything else)."""

__version__ = "0.1.0"
"""Keep in step with ``version`` in ``pyproject.toml``."""
