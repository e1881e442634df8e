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

    The message is ``"<field>: <reason>"``, or the reason with ``{setting}`` replaced by the field's name
    when it names the field itself; the command line names the option instead (``"argument --batch-size:
    expected ..."``, ``"--benchmark-data takes BENCHMARK=FILE ..."``).

    Example:
        >>> raise SettingError("batch_size", "expected a whole number >= 1, got 0")
        >>> raise SettingError("data", "{setting} takes BENCHMARK=FILE, got 'gsm8k'")
    """

    def __init__(self, setting: str, reason: str):
        super().__init__(reason.replace("{setting}", setting) if "{setting}" in reason else f"{setting}: {reason}")
        self.setting = setting
        self.reason = reason


class ContextLengthError(LensprobeError):
    """A prompt longer than the model's context: callers that pass over such prompts (a check that some
    prompt of a condition fits) catch this one, so any other refusal (a control token in the text) keeps
    its own message."""


class UnexpectedError(LensprobeError):
    """An exception lensprobe did not foresee, raised inside a public function and turned into one line
    naming the function, the input and the fix (:mod:`lensprobe.core.boundary`); chained ``from`` the
    original, and also an instance of the original's class where Python allows (``except KeyError``
    still catches a missing key)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
