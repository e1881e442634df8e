r"""Answer extraction and grading for MATH-style problems.

Two graders, both reported by the harness:

- ``"math-verify"`` (default): Hugging Face's `math-verify` parses both answers (LaTeX or
  plain expressions) into sympy objects and compares them mathematically, so
  ``0.5 == \frac{1}{2}``, ``x = 3 == 3``, ``90^\circ == 90``, ``\text{(C)} == C``, sets and
  tuples compare element-wise.
- ``"paper"``: the string grader of the MATH dataset (Hendrycks et al. 2021): both strings
  are normalised (``\dfrac``/``\tfrac`` to ``\frac``, no ``\left``/``\right``, no degrees,
  no ``\$`` or ``\%``, units written as ``\text{ unit}`` dropped, ``k = `` prefixes dropped,
  spaces removed, ``\frac12`` and ``1/2`` to ``\frac{1}{2}``, ``0.5`` to ``\frac{1}{2}``) and
  compared as strings.

``lenient=True`` adds the meaningless-tokens paper's extra rule: a prediction also counts
when its normalised string is a substring of the normalised reference. This inflates
accuracy (``1`` is accepted for ``10``), so it is off by default and reported separately as
``paper-lenient``.
"""

import re
import threading
from typing import Literal

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import heavy

GradingMethod = Literal["math-verify", "paper"]
METHODS = ("math-verify", "paper")
GRADERS = ("math-verify", "paper", "paper-lenient")
"""Grader names used in result tables: the two methods, and the paper's grader with the lenient rule."""

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


# ---------------------------------------------------------------------------------------
# The MATH dataset's string normalisation (Hendrycks et al. 2021, math_equivalence.py).


def _fix_fracs(string: str) -> str:
    substrs = string.split("\\frac")
    new_str = substrs[0]
    for substr in substrs[1:]:
        new_str += "\\frac"
        if substr.startswith("{"):
            new_str += substr
            continue
        if len(substr) < 2:
            return string
        a, b = substr[0], substr[1]
        if b != "{":
            new_str += "{" + a + "}{" + b + "}" + substr[2:]
        else:
            new_str += "{" + a + "}" + b + substr[2:]
    return new_str


def _fix_a_slash_b(string: str) -> str:
    parts = string.split("/")
    if len(parts) != 2:
        return string
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return string
    if string != f"{a}/{b}":
        return string
    return "\\frac{" + str(a) + "}{" + str(b) + "}"


def _remove_right_units(string: str) -> str:
    # "\text{ " (with the space) is how MATH writes units on the right.
    if "\\text{ " in string:
        splits = string.split("\\text{ ")
        if len(splits) != 2:
            raise ValueError("several unit groups")
        return splits[0]
    return string


def _fix_sqrt(string: str) -> str:
    if "\\sqrt" not in string:
        return string
    splits = string.split("\\sqrt")
    new_string = splits[0]
    for split in splits[1:]:
        if split and split[0] != "{":
            new_string += "\\sqrt{" + split[0] + "}" + split[1:]
        else:
            new_string += "\\sqrt" + split
    return new_string


def normalize_answer(string: str) -> str:
    r"""The MATH dataset's answer normalisation (``strip_string`` of Hendrycks et al.).

    Example:
        >>> normalize_answer(r"\dfrac{1}{2}"), normalize_answer("x = 0.5")
        ('\\frac{1}{2}', '\\frac{1}{2}')
    """
    string = string.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    string = string.replace("tfrac", "frac").replace("dfrac", "frac")
    string = string.replace("\\left", "").replace("\\right", "")
    string = string.replace("^{\\circ}", "").replace("^\\circ", "")
    string = string.replace("\\$", "")
    string = _remove_right_units(string)
    string = string.replace("\\%", "").replace("%", "")
    string = string.replace(" .", " 0.").replace("{.", "{0.")
    if not string:
        return string
    if string[0] == ".":
        string = "0" + string
    if len(string.split("=")) == 2 and len(string.split("=")[0]) <= 2:
        string = string.split("=")[1]
    string = _fix_sqrt(string)
    string = string.replace(" ", "")
    string = _fix_fracs(string)
    if string == "0.5":
        string = "\\frac{1}{2}"
    return _fix_a_slash_b(string)


def _paper_equiv(prediction: str, answer: str, lenient: bool) -> bool:
    try:
        a, b = normalize_answer(prediction), normalize_answer(answer)
    except (ValueError, IndexError):
        a, b = prediction, answer
    if a == b:
        return True
    return bool(lenient and a and a in b)


def _math_verify_equiv(prediction: str, answer: str) -> bool:
    try:
        math_verify = heavy("math_verify")
    except ImportError as err:
        raise LensprobeError(
            "method='math-verify' needs the math-verify package: "
            "pip install 'math-verify[antlr4_13_2]' (or use method='paper')."
        ) from err
    parse, verify = math_verify.parse, math_verify.verify
    # math-verify's timeouts use SIGALRM, which only works in the main thread.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse("\\boxed{" + answer + "}", parsing_timeout=timeout)
    pred = parse("\\boxed{" + prediction + "}", parsing_timeout=timeout)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


def grade(prediction: str | None, answer: str, method: GradingMethod = "math-verify", *,
          lenient: bool = False) -> bool:
    r"""Whether an extracted answer matches the reference answer.

    Args:
        prediction: the model's answer, usually :func:`extract_boxed` of the generated
            text; ``None`` (nothing boxed) is always wrong.
        answer: the reference answer (LaTeX, as in MATH-500's ``answer`` field).
        method: ``"math-verify"`` (symbolic equivalence) or ``"paper"`` (the MATH dataset's
            string normalisation and exact match).
        lenient: also accept a prediction whose normalised string is a substring of the
            normalised answer (the meaningless-tokens paper's rule; inflates accuracy).

    Returns:
        ``True`` when the answer counts as correct.

    Example:
        >>> grade(r"\dfrac{1}{2}", "0.5")
        True
        >>> grade("x = 3", "3", method="paper")
        True
    """
    if method not in METHODS:
        raise LensprobeError(f"unknown grading method {method!r}: use one of {METHODS}.")
    if not isinstance(answer, str) or not answer.strip():
        raise LensprobeError(f"the reference answer must be a non-empty string, got {answer!r}.")
    if prediction is None or not str(prediction).strip():
        return False
    prediction = str(prediction).strip()
    answer = answer.strip()
    if method == "paper":
        return _paper_equiv(prediction, answer, lenient)
    if _math_verify_equiv(prediction, answer):
        return True
    return lenient and _paper_equiv(prediction, answer, True)


def grade_all(prediction: str | None, answer: str) -> dict[str, bool]:
    """Verdicts of every grader in :data:`GRADERS` (the columns of a result row)."""
    return {
        "math-verify": grade(prediction, answer, "math-verify"),
        "paper": grade(prediction, answer, "paper"),
        "paper-lenient": grade(prediction, answer, "paper", lenient=True),
    }
