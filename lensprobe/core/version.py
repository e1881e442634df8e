"""lensprobe's version, in a module of its own so that any part of the package can read it
without importing the top-level package (which imports everything else).

It is set here and only here: ``pyproject.toml`` takes the package's version from this constant
(``[tool.setuptools.dynamic]``), so the installed metadata and ``lp.__version__`` cannot disagree.
"""

__version__ = "0.5.0"
"""The release; every identity of lensprobe's functions holds it, so a new release is a new run."""
