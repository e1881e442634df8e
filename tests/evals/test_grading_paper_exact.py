r"""The ``paper-exact`` grader (the meaningless-tokens authors' rules) against a table judged by
hand, one or more rows per quirk; and the existing graders left as they were."""

import pytest

import lensprobe as lp
from lensprobe.evals.grading.extract import extract_boxed
from lensprobe.evals.grading.grade import (
    GRADERS,
    extract_boxed_paper,
    grade,
    grade_all,
    grade_paper_exact,
    normalize_answer_paper_exact,
)

MATH_PROMPT = "Please reason step by step and put your final answer within \\boxed{{}}.What is 3+7?"
PASS_K_PROMPT = "Please reason step by step and put your final answer within \\boxed{}.What is 3+7?"

# (full decoded text, reference answer, verdict, what the row checks)
CASES = [
    # box selection
    (r"first \boxed{3}, finally \boxed{7}", "7", True, "last box wins"),
    (r"first \boxed{7}, finally \boxed{3}", "7", False, "last box wins (earlier right one ignored)"),
    (r"\fbox{3}", "3", True, r"\fbox read when there is no \boxed"),
    (r"\boxed{4} and later \fbox{3}", "3", False, r"\fbox ignored when a \boxed exists, even later"),
    (r"\fbox{3} and later \boxed{4}", "4", True, r"\boxed preferred"),
    (r"so \boxed 5", "5", False, r"\boxed 5 without braces not read"),
    (r"\boxed{5}, i.e. \boxed 5", "5", False, r"last \boxed is brace-less: nothing read"),
    ("the answer is 5", "5", False, "no box: wrong"),
    (r"\boxed{\frac{1}{2", r"\frac{1}{2}", False, "unclosed box: wrong"),
    (r"\boxed{\frac{1}{2}}", r"\frac12", True, "nested braces"),
    # leniency: a == b or a in b
    (r"\boxed{1}", "10", True, "substring of the reference accepted"),
    (r"\boxed{10}", "1", False, "superstring not accepted"),
    (r"\boxed{}", "42", True, "empty box accepted for every problem"),
    (r"\boxed{ }", "42", True, "blank box normalises to empty: accepted"),
    (r"\boxed{2}", r"\frac{1}{2}", True, "digit inside a fraction accepted"),
    # the prompt is part of the graded text
    (MATH_PROMPT + " It is 10.", "10", False, r"prompt's \boxed{{}} read as '{}'"),
    (PASS_K_PROMPT + " It is 10.", "10", True, r"prompt's empty \boxed{} accepted"),
    (MATH_PROMPT + r" So \boxed{10}.", "10", True, "generation's box after the prompt's"),
    # percent: only \% removed
    (r"\boxed{50\%}", "50", True, r"\% removed"),
    (r"\boxed{50%}", "50", False, "bare % kept"),
    (r"\boxed{50%}", r"50\%", False, r"bare % kept, reference's \% removed"),
    (r"\boxed{50}", "50%", True, "50 is a substring of 50%"),
    # units: text before the first "\text{ "
    (r"\boxed{10\text{ cm}}", "10", True, "unit dropped"),
    (r"\boxed{5\text{ m}\text{ s}}", "5", True, "several units: splits[0] kept"),
    (r"\boxed{10\text{cm}}", "10", False, r"\text{cm} without the space is no unit: kept"),
    # Hendrycks' normalisation
    (r"\boxed{\dfrac{1}{2}}", "0.5", True, "dfrac and 0.5"),
    (r"\boxed{\tfrac34}", r"\frac{3}{4}", True, "tfrac and frac34"),
    (r"\boxed{1/2}", r"\frac{1}{2}", True, "a/b"),
    (r"\boxed{.5}", r"\frac{1}{2}", True, "leading . then 0.5"),
    (r"\boxed{\sqrt2}", r"\sqrt{2}", True, "sqrt fix"),
    (r"\boxed{90^\circ}", "90", True, "degrees"),
    (r"\boxed{90^{\circ}}", "90", True, "degrees with braces"),
    (r"\boxed{\left(1, 2\right)}", "(1,2)", True, r"\left \right and spaces"),
    (r"\boxed{\$5}", "5", True, "dollar"),
    (r"\boxed{x = 3}", "3", True, "short k = prefix dropped"),
    (r"\boxed{abc = 3}", "3", False, "long prefix kept"),
    (r"\boxed{3\!000}", "3000", True, r"\! removed"),
]


# each case's id given with pytest.param, not as `ids=`: pytest keeps an `ids=` list it has escaped on the mark and
# escapes it again when the module is collected a second time in one process (mutmut's runs), so an id holding a
# backslash would change between collections and no longer be found
@pytest.mark.parametrize(("text", "answer", "verdict", "why"), [pytest.param(*case, id=case[3]) for case in CASES])
def test_paper_exact_table(text, answer, verdict, why):
    assert grade_paper_exact(text, answer) is verdict
    assert grade(text, answer, method="paper-exact") is verdict
    assert lp.grade(text, answer, method="paper-exact") is verdict


def test_extraction_quirks():
    assert extract_boxed_paper(r"\boxed{}") == ""
    assert extract_boxed(r"\boxed{}") is None  # lensprobe's extractor: empty -> None
    assert extract_boxed_paper(r"\boxed 5") is None
    assert extract_boxed(r"\boxed 5") == "5"
    assert extract_boxed_paper(r"\boxed{a} \fbox{b}") == "a"
    assert extract_boxed(r"\boxed{a} \fbox{b}") == "b"
    assert extract_boxed_paper(r"\boxed{a\}b}") == "a\\"  # escaped braces count too
    assert extract_boxed_paper(r"\boxed{\{1,2\}}") == r"\{1,2\}"
    assert extract_boxed_paper(None) is None and extract_boxed_paper("") is None


def test_normalisation_quirks():
    assert normalize_answer_paper_exact(r"50\%") == "50"
    assert normalize_answer_paper_exact("50%") == "50%"
    assert normalize_answer_paper_exact(r"5\text{ m}\text{ s}") == "5"
    assert normalize_answer_paper_exact(r"k = \dfrac{1}{2}") == r"\frac{1}{2}"
    assert normalize_answer_paper_exact("") == ""
    with pytest.raises(IndexError, match="string index out of range"):
        normalize_answer_paper_exact(r"3\frac")
    with pytest.raises(IndexError, match="string index out of range"):
        normalize_answer_paper_exact(r"2\sqrt")


def test_existing_graders_and_row_columns_are_unchanged():
    assert GRADERS == ("math-verify", "paper", "paper-lenient")
    assert "paper-exact" not in grade_all("50", "50")
    assert grade("50%", "50", method="paper") is True  # the strict grader still drops a bare %
    assert grade("1", "10", method="paper") is False
    assert grade("1", "10", method="paper", lenient=True) is True
    assert grade(None, "10", method="paper-exact") is False


@pytest.mark.unchecked
def test_bad_input():
    with pytest.raises(lp.LensprobeError, match=r"unknown grading method 'exact'.*'paper-exact'"):
        grade(r"\boxed{1}", "1", method="exact")
    with pytest.raises(lp.LensprobeError, match=r"the reference answer must be a non-empty string, got ''"):
        grade(r"\boxed{1}", "", method="paper-exact")
    with pytest.raises(lp.LensprobeError, match=r"the reference answer must be a string, got 10"):
        grade_paper_exact(r"\boxed{10}", 10)
