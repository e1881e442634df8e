r"""Grading MATH-style answers (extraction: :mod:`lensprobe.evals.grading.extract`).

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

- ``"paper-exact"``: the meaningless-tokens authors' grader reproduced quirk for quirk
  (:func:`grade_paper_exact`). It grades the *full decoded text* (prompt + generation), not an
  extracted answer, and is always lenient; it is not a column of result rows
  (:data:`GRADERS`), call it on ``prompt text + generation``.

``lenient=True`` adds the meaningless-tokens paper's extra rule: a prediction also counts
when its normalised string is a substring of the normalised reference. This inflates
accuracy (``1`` is accepted for ``10``), so it is off by default and reported separately as
``paper-lenient``.
"""

from typing import Literal

from lensprobe.core.errors import LensprobeError
from lensprobe.evals.grading.mathverify import GRADE_TIMEOUT, check_timeout, math_verify_equiv

GradingMethod = Literal["math-verify", "paper", "paper-exact"]
METHODS = ("math-verify", "paper", "paper-exact")
GRADERS = ("math-verify", "paper", "paper-lenient")
"""Grader names used in result tables: the two methods, and the paper's grader with the lenient rule."""

def _fix_fracs(string: str, strict: bool = False) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``; ``strict``: an empty piece after ``\\frac`` raises ``IndexError``."""
    substrs = string.split("\\frac")
    new_str = substrs[0]
    for substr in substrs[1:]:
        new_str += "\\frac"
        if strict and not substr:
            raise IndexError("string index out of range")
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


def _fix_sqrt(string: str, strict: bool = False) -> str:
    """``\\sqrt2`` -> ``\\sqrt{2}``; ``strict``: an empty piece after ``\\sqrt`` raises ``IndexError``."""
    if "\\sqrt" not in string:
        return string
    splits = string.split("\\sqrt")
    new_string = splits[0]
    for split in splits[1:]:
        if strict and not split:
            raise IndexError("string index out of range")
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
    return _strip_string(string, units=_remove_right_units, percent=("\\%", "%"), strict=False)


def _strip_string(string: str, *, units, percent: tuple[str, ...], strict: bool) -> str:
    """Hendrycks' MATH normalisation; ``units`` removes right units, ``percent`` lists what is removed."""
    string = string.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    string = string.replace("tfrac", "frac").replace("dfrac", "frac")
    string = string.replace("\\left", "").replace("\\right", "")
    string = string.replace("^{\\circ}", "").replace("^\\circ", "")
    string = string.replace("\\$", "")
    string = units(string)
    for sign in percent:
        string = string.replace(sign, "")
    string = string.replace(" .", " 0.").replace("{.", "{0.")
    if not string:
        return string
    if string[0] == ".":
        string = "0" + string
    if len(string.split("=")) == 2 and len(string.split("=")[0]) <= 2:
        string = string.split("=")[1]
    string = _fix_sqrt(string, strict)
    string = string.replace(" ", "")
    string = _fix_fracs(string, strict)
    if string == "0.5":
        string = "\\frac{1}{2}"
    return _fix_a_slash_b(string)


# ---------------------------------------------------------------------------------------
# The meaningless-tokens authors' grader, reproduced rule for rule ("paper-exact").

_PAPER_BOXES = ("\\boxed", "\\fbox")


def extract_boxed_paper(text: str | None) -> str | None:
    r"""The box the authors' grader reads: the content of the last ``\boxed{...}``.

    Unlike :func:`~lensprobe.evals.grading.extract.extract_boxed`: ``\fbox`` is read only when the text holds no ``\boxed`` at
    all; the last ``\boxed`` must be followed directly by ``{`` (``\boxed 5`` gives ``None``,
    even when an earlier ``\boxed{5}`` exists); every ``{`` and ``}`` counts when matching
    braces (escaped ones too); an empty box gives ``""`` (not ``None``); an unclosed box gives
    ``None``.

    Example:
        >>> extract_boxed_paper(r"\boxed{1} then \boxed{\frac{1}{2}}")
        '\\frac{1}{2}'
        >>> extract_boxed_paper(r"\boxed{}")
        ''
    """
    if not text:
        return None
    for cmd in _PAPER_BOXES:
        start = text.rfind(cmd)
        if start >= 0:
            break
    else:
        return None
    open_at = start + len(cmd)
    if not text.startswith("{", open_at):
        return None
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1:j]
    return None


class PaperGraderError(LensprobeError):
    """The authors' ``is_equiv`` raises on this answer: a ``\\frac`` or ``\\sqrt`` with nothing after it
    (an ``IndexError`` in their ``_fix_fracs`` / ``_fix_sqrt``). Their MATH-500 script does not catch it, so
    their run would stop there; an evaluation makes the row an error row (``finish="error"``), except under
    the pass@3 protocols, whose loop catches it and counts the sample wrong (``Protocol.ungradable``)."""


def normalize_answer_paper_exact(string: str) -> str:
    r"""The authors' normalisation: Hendrycks' ``_strip_string`` with their changes.

    Differs from :func:`normalize_answer` in three ways: units keep the text before the first
    ``"\text{ "`` even when there are several (the original insisted on exactly one);
    only ``\%`` is removed (a bare ``%`` stays); a ``\frac`` or ``\sqrt`` with nothing after it
    (at the end, or right before another) raises ``IndexError``, as theirs does.

    Example:
        >>> normalize_answer_paper_exact(r"50\%"), normalize_answer_paper_exact("50%")
        ('50', '50%')
    """
    return _strip_string(string, units=lambda text: text.split("\\text{ ")[0], percent=("\\%",), strict=True)


def grade_paper_exact(full_text: str | None, answer: str) -> bool:
    r"""The meaningless-tokens authors' verdict on a generation, quirks included.

    Their evaluation decodes the whole sequence (prompt + generation, special tokens
    skipped) and grades it against the reference answer:

    1. The answer is the last ``\boxed{...}`` of the whole text (:func:`extract_boxed_paper`):
       ``\fbox`` only when there is no ``\boxed`` anywhere; ``\boxed 5`` without braces is
       not read; nothing boxed is wrong. Because the prompt is part of the text, a
       generation without a box is graded on the prompt's own box (``\boxed{}`` in their
       pass@k prompt: an empty answer; ``\boxed{{}}`` in their MATH-500 prompt: ``{}``).
    2. Both strings are normalised (:func:`normalize_answer_paper_exact`): Hendrycks' MATH
       rules (no line breaks, ``\!``, ``\left``/``\right``, degrees or ``\$``; ``\\`` to
       ``\``; ``tfrac``/``dfrac`` to ``frac``; the text before the first ``"\text{ "``
       kept; ``\%`` removed but a bare ``%`` kept; ``" ."``/``"{."`` to ``" 0."``/``"{0."``
       and a leading ``.`` to ``0.``; a prefix ``k = `` dropped when the part before ``=``
       has at most 2 characters; ``\sqrt2`` to ``\sqrt{2}``; spaces removed; ``\frac12`` to
       ``\frac{1}{2}``; ``0.5`` to ``\frac{1}{2}``; ``a/b`` of integers to ``\frac{a}{b}``).
       Where their normalisation raises (a ``\frac`` or ``\sqrt`` with nothing after it), so does this:
       :class:`PaperGraderError` (their MATH-500 loop would stop; an evaluation writes an error row).
    3. Always lenient: correct when ``a == b`` or ``a`` is a substring of ``b`` (prediction
       ``1`` is accepted for ``10``; an empty box ``\boxed{}`` is accepted for every
       problem).

    Args:
        full_text: the decoded prompt followed by the generation.
        answer: the reference answer.

    Returns:
        The authors' verdict (it inflates accuracy: use ``"math-verify"`` or ``"paper"`` for
        a strict one).

    Raises:
        PaperGraderError: where the authors' ``is_equiv`` raises (see step 2).

    Example:
        >>> grade_paper_exact(r"Please ... \boxed{{}}.What is 3+7? ... \boxed{1}", "10")
        True
    """
    if not isinstance(answer, str):
        raise LensprobeError(f"the reference answer must be a string, got {answer!r}.")
    prediction = extract_boxed_paper(full_text)
    if prediction is None:
        return False
    try:
        a, b = normalize_answer_paper_exact(prediction), normalize_answer_paper_exact(answer)
    except IndexError as err:
        raise PaperGraderError(
            f"the authors' grader (is_equiv) raises on the boxed answer {prediction!r} or the reference "
            f"{answer!r}: a \\frac or \\sqrt with nothing after it (IndexError in their _fix_fracs/_fix_sqrt), "
            "so their script would stop here; no verdict") from err
    return a == b or a in b


def _paper_equiv(prediction: str, answer: str, lenient: bool) -> bool:
    try:
        a, b = normalize_answer(prediction), normalize_answer(answer)
    except (ValueError, IndexError):
        a, b = prediction, answer
    if a == b:
        return True
    return bool(lenient and a and a in b)


def grade(prediction: str | None, answer: str, method: GradingMethod = "math-verify", *,
          lenient: bool = False, timeout: int | None = GRADE_TIMEOUT) -> bool | None:
    r"""Whether an extracted answer matches the reference answer.

    Args:
        prediction: the model's answer, usually :func:`~lensprobe.evals.grading.extract.extract_boxed` of the generated
            text; ``None`` (nothing boxed) is always wrong.
        answer: the reference answer (LaTeX, as in MATH-500's ``answer`` field).
        method: ``"math-verify"`` (symbolic equivalence), ``"paper"`` (the MATH dataset's
            string normalisation and exact match) or ``"paper-exact"`` (the
            meaningless-tokens authors' grader, :func:`grade_paper_exact`: then
            ``prediction`` is the full decoded text, prompt + generation, not an extracted
            answer).
        lenient: also accept a prediction whose normalised string is a substring of the
            normalised answer (the meaningless-tokens paper's rule; inflates accuracy).
            ``"paper-exact"`` is always lenient and ignores it.
        timeout: ``"math-verify"`` only: whole seconds each of its steps may take (default
            5); ``None``: no limit. Answers equal after :func:`normalize_answer` are equal at once.

    Returns:
        ``True`` when the answer counts as correct, ``False`` when not, ``None`` when
        math-verify timed out (:mod:`lensprobe.evals.grading.mathverify`; left out of the statistics).

    Raises:
        LensprobeError: an unknown method, a reference answer that is not a non-empty string,
            a prediction that is not a string or ``None``, or a bad ``timeout``.

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
    if prediction is not None and not isinstance(prediction, str):
        raise LensprobeError(f"the prediction must be a string or None (nothing extracted), got "
                             f"{type(prediction).__name__} {prediction!r}.")
    timeout = check_timeout(timeout)
    if method == "paper-exact":
        return grade_paper_exact(prediction, answer)
    if prediction is None or not prediction.strip():
        return False
    prediction = prediction.strip()
    answer = answer.strip()
    if method == "paper":
        return _paper_equiv(prediction, answer, lenient)
    if _same_after_normalising(prediction, answer):
        return True
    verdict = math_verify_equiv(prediction, answer, timeout)
    if verdict is not False:
        return verdict
    return lenient and _paper_equiv(prediction, answer, True)


def _same_after_normalising(a: str, b: str) -> bool:
    """``a`` and ``b`` are the same answer without any maths: equal as written or after :func:`normalize_answer`."""
    if a == b:
        return True
    try:
        return normalize_answer(a) == normalize_answer(b)
    except (ValueError, IndexError):
        return False


def grade_all(prediction: str | None, answer: str, *, timeout: int | None = GRADE_TIMEOUT) -> dict[str, bool | None]:
    """Verdicts of every grader in :data:`GRADERS` (the columns of a result row); ``None`` where
    math-verify timed out (see :func:`grade`)."""
    return {
        "math-verify": grade(prediction, answer, "math-verify", timeout=timeout),
        "paper": grade(prediction, answer, "paper"),
        "paper-lenient": grade(prediction, answer, "paper", lenient=True),
    }
