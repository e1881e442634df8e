"""Text given to lensprobe, checked as text: a string, not empty where it must hold something, and
without lone surrogates (what undecodable bytes of a file name or terminal become in Python).
A tokenizer or a UTF-8 file would fail on them later with an error that names neither the
argument nor the fix."""

import re
import unicodedata
from typing import Any

from lensprobe.core.errors import LensprobeError

__all__ = ["blank", "check_text", "surrogate_at"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def surrogate_at(text: str) -> int | None:
    """The index of the first lone surrogate in ``text``, or ``None`` when it is all text.

    Example:
        >>> surrogate_at("what \\udcff is"), surrogate_at("what is")
        (5, None)
    """
    found = _SURROGATE.search(text)
    return found.start() if found else None


def blank(text: str) -> bool:
    """Whether ``text`` shows nothing: only whitespace and invisible format characters (zero-width
    spaces and joiners, U+FEFF, ...: Unicode category Cf), which ``str.strip()`` keeps.

    Example:
        >>> blank("\\u200b\\ufeff "), blank("a\\u200b")
        (True, False)
    """
    return all(c.isspace() or unicodedata.category(c) == "Cf" for c in text)


def check_text(value: Any, name: str, *, empty: bool = False) -> str:
    """``value`` when it is text: a string, not empty (unless ``empty``), without lone surrogates.

    Args:
        value: what was passed.
        name: the argument's name, for the message (``"question"``).
        empty: accept an empty string.

    Raises:
        LensprobeError: ``value`` is not a string, is empty, or holds a lone surrogate.

    Example:
        >>> check_text("What is 2+3?", "question")
        'What is 2+3?'
    """
    if value is None:
        raise LensprobeError(f"{name} is empty (got None): pass a non-empty string.")
    if not isinstance(value, str):
        raise LensprobeError(f"{name} must be a string, got {type(value).__name__} {value!r}.")
    if not empty and blank(value):
        what = "is empty" if not value.strip() else "shows nothing (only invisible characters such as U+200B or U+FEFF)"
        raise LensprobeError(f"{name} {what}: pass a non-empty string.")
    at = surrogate_at(value)
    if at is not None:
        raise LensprobeError(f"{name} holds a lone surrogate (U+{ord(value[at]):04X} at character {at}), which is not "
                             "text (undecodable bytes read with errors='surrogateescape'?): decode the text properly "
                             "or remove it.")
    return value
