"""Answer extraction: the last ``\\boxed{}`` (the MATH convention) or the last number in a generation.

:func:`extract_answer` reads a generation's answer by ``method`` (:data:`EXTRACT_METHODS`);
:func:`~lensprobe.evals.grading.grade.grade` compares it with the reference.
"""

import re

from lensprobe.core.errors import LensprobeError

__all__ = ["EXTRACT_METHODS", "check_extract", "extract_answer", "extract_boxed", "extract_last_number"]

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def extract_boxed(text: str | None) -> str | None:
    r"""Content of the last ``\boxed{...}`` (or ``\fbox{...}``) in ``text``, or ``None``.

    Braces are matched, so nested braces survive (``\boxed{\frac{1}{2}}`` gives
    ``\frac{1}{2}``). ``\boxed 5`` (no braces) gives ``5``. An unclosed box (a generation cut
    off by ``max_new_tokens``) or an empty one gives ``None``. Pass the generated text only,
    never the prompt: the prompt's system message itself contains ``\boxed{}``.

    Example:
        >>> extract_boxed(r"so the answer is $\boxed{\frac{1}{2}}$.")
        '\\frac{1}{2}'
        >>> extract_boxed("no box here") is None
        True
    """
    if not text:
        return None
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    i = start + len(cmd)
    rest = text[i:]
    if not rest.startswith("{"):
        # "\boxed 5" form: the argument runs to the next "$" or whitespace.
        m = re.match(r"[ \t]+([^\s$]+)", rest)
        return m.group(1) if m else None
    depth = 0
    for j in range(i, len(text)):
        ch = text[j]
        if ch == "{" and (j == i or text[j - 1] != "\\"):
            depth += 1
        elif ch == "}" and text[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                content = text[i + 1:j].strip()
                return content or None
    return None


EXTRACT_METHODS = ("boxed", "last-number")
"""How the harness reads a generation's answer: ``"boxed"`` (:func:`extract_boxed`, the default)
or ``"last-number"`` (:func:`extract_last_number`)."""

# A number: an optional sign (only where it cannot be a subtraction: not after a letter, digit or
# closing bracket), digits with optional thousands separators (a comma followed by exactly three
# digits), an optional decimal part; or a bare decimal part such as ".5".
_LAST_NUMBER = re.compile(
    r"(?:(?<![\w)\]}])[-\u2212])?"
    r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|(?<![\d.])\.\d+)"
)


def extract_last_number(text: str | None) -> str | None:
    r"""The last number in ``text`` (lm-eval's "flexible extraction"), or ``None``.

    For models that state an answer without ``\boxed{}``: the answer is the last number of
    the generated text, whatever surrounds it (LaTeX included: ``\frac{3}{4}`` gives ``4``).
    Thousands separators are removed (``1,234`` gives ``1234``; a comma counts as one only
    when exactly three digits follow it, so ``1,2`` is the two numbers ``1`` and ``2``); a
    period ending the sentence is not part of the number (``42.`` gives ``42``); decimals
    are kept as written (``3.50``). A minus sign belongs to the number when it cannot be a
    subtraction: ``x = -5`` gives ``-5``, ``8-5`` gives ``5``. The Unicode minus ``−`` is
    read as ``-``.

    Args:
        text: the generated text (not the prompt, whose own numbers would be read).

    Returns:
        The number as a string, or ``None`` when the text holds no digit.

    Example:
        >>> extract_last_number("17 + 25 = 42, so the answer is 1,042.")
        '1042'
        >>> extract_last_number("x = -5") , extract_last_number("no digits") is None
        ('-5', True)
    """
    if not text:
        return None
    found = _LAST_NUMBER.findall(text)
    if not found:
        return None
    return found[-1].replace(",", "").replace("\u2212", "-")


def extract_answer(text: str | None, method: str = "boxed") -> str | None:
    r"""The answer of a generation read by ``method`` (one of :data:`EXTRACT_METHODS`).

    Args:
        text: the generated text.
        method: ``"boxed"`` (:func:`extract_boxed`) or ``"last-number"``
            (:func:`extract_last_number`).

    Returns:
        The extracted answer, or ``None`` when there is none.

    Raises:
        LensprobeError: an unknown ``method``.

    Example:
        >>> extract_answer(r"\boxed{7} and then 8", "boxed"), extract_answer(r"\boxed{7} and then 8", "last-number")
        ('7', '8')
    """
    check_extract(method)
    return extract_boxed(text) if method == "boxed" else extract_last_number(text)


def check_extract(method) -> str:
    """``method`` when it is one of :data:`EXTRACT_METHODS`, else an error naming them.

    Raises:
        LensprobeError: an unknown extraction method.

    Example:
        >>> check_extract("last-number")
        'last-number'
    """
    if method not in EXTRACT_METHODS:
        raise LensprobeError(f"unknown extract={method!r}: use one of {EXTRACT_METHODS} ('boxed' reads the last "
                             "\\boxed{...}, 'last-number' the last number of the generated text).")
    return method


# ---------------------------------------------------------------------------------------
# The MATH dataset's string normalisation (Hendrycks et al. 2021, math_equivalence.py).
