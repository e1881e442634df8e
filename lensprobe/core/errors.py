"""Exception types raised by lensprobe.

Every error names what was wrong and what to do about it. Callers that want to
handle lensprobe's own errors catch :class:`LensprobeError`; every warning lensprobe issues is a
:class:`LensprobeWarning`.
"""


class LensprobeError(ValueError):
    """Bad input to a lensprobe function: the message says what and how to fix it."""


class LensprobeWarning(UserWarning):
    """Base of every warning lensprobe issues, so they can be filtered as one (the test suite turns them
    into errors: a test that expects one says so with ``pytest.warns``)."""


class NonFiniteWarning(LensprobeWarning, RuntimeWarning):
    """Non-finite logits (NaN, +inf, or all -inf) ended generation rows."""


class ModelLoadError(LensprobeError, RuntimeError):
    """A model could not be loaded (missing package, offline hub, unreadable file)."""


class SettingError(LensprobeError):
    """A field of a configuration dataclass holds a bad value; ``setting`` names the field.

    The message starts with the field's name (``"batch_size: must be ..."``), so the command line can
    name the option that set it instead (``"--batch-size: must be ..."``).

    Example:
        >>> raise SettingError("batch_size", "must be a whole number >= 1, got 0")
    """

    def __init__(self, setting: str, message: str):
        super().__init__(f"{setting}: {message}")
        self.setting = setting
        self.reason = message
