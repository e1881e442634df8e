"""Exception types raised by lensprobe.

Every error names what was wrong and what to do about it. Callers that want to
handle lensprobe's own errors catch :class:`LensprobeError`.
"""


class LensprobeError(ValueError):
    """Bad input to a lensprobe function: the message says what and how to fix it."""


class ModelLoadError(LensprobeError, RuntimeError):
    """A model could not be loaded (missing package, offline hub, unreadable file)."""
