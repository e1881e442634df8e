"""Answer extraction and the two graders, checked against a table of judged cases."""

import pytest

import lensprobe as lp
from lensprobe.evals.grading.grade import grade_all, normalize_answer

# (prediction, reference answer, math-verify verdict, paper (MATH string-match) verdict).
# math-verify judges mathematical equivalence; the paper grader compares strings after the
# MATH dataset's normalisation (dfrac->frac, no \left/\right, no degrees, no \$, units after
# "\text{ " dropped, "x = " prefixes dropped, spaces removed, 1/2 and 0.5 -> \frac{1}{2}).
GRADE_CASES = [
    # fractions and \dfrac
    (r"\frac{1}{2}", r"\frac{1}{2}", True, True),
    (r"\dfrac{1}{2}", r"\frac{1}{2}", True, True),
    (r"\tfrac{3}{4}", r"\frac34", True, True),
    ("0.5", r"\frac{1}{2}", True, True),
    ("1/2", r"\frac{1}{2}", True, True),
    (r"\frac{2}{4}", r"\frac{1}{2}", True, False),
    ("0.75", r"\frac{3}{4}", True, False),
    (r"\frac{1}{3}", r"\frac{1}{2}", False, False),
    (r"-\frac{1}{2}", r"-\frac12", True, True),
    (r"\frac{-1}{2}", r"-\frac{1}{2}", True, False),
    (r"\frac{\sqrt{3}}{2}", r"\frac{\sqrt3}{2}", True, True),
    # degrees
    (r"90^\circ", "90", True, True),
    (r"90^{\circ}", r"90^\circ", True, True),
    ("45", r"90^\circ", False, False),
    # \text{}
    (r"\text{east}", r"\text{east}", True, True),
    ("east", r"\text{east}", True, False),
    (r"\text{(C)}", r"\text{(C)}", True, True),
    ("C", r"\text{(C)}", True, False),
    (r"\text{(B)}", r"\text{(C)}", False, False),
    # intervals
    (r"(5,\infty)", r"(5,\infty)", True, True),
    (r"(5, \infty)", r"(5,\infty)", True, True),
    (r"\left(5, \infty\right)", r"(5,\infty)", True, True),
    (r"[5,\infty)", r"(5,\infty)", False, False),
    # tuples
    ("(15,-29)", "(15,-29)", True, True),
    ("(-29,15)", "(15,-29)", False, False),
    (r"\left( 3, \frac{\pi}{2} \right)", r"\left( 3, \frac{\pi}{2} \right)", True, True),
    (r"(3, \pi/2)", r"\left( 3, \frac{\pi}{2} \right)", True, False),
    (r"(2, \pi/2)", r"\left( 3, \frac{\pi}{2} \right)", False, False),
    # x = 3 vs 3
    ("x = 3", "3", True, True),
    ("x=3", "3", True, True),
    ("3", "x = 3", True, True),
    ("x = 4", "3", False, False),
    # units and currency
    (r"5\text{ cm}", "5", True, True),
    (r"12\text{ inches}", "12", True, True),
    (r"5 \text{cm}", "5", True, False),
    (r"\$18.90", "18.90", True, True),
    ("18.9", r"\$18.90", True, False),
    (r"10\%", "10", True, True),
    # roots, expressions, sets, matrices, constants
    (r"\sqrt{51}", r"\sqrt{51}", True, True),
    (r"\sqrt51", r"\sqrt{51}", False, False),  # LaTeX reads \sqrt51 as \sqrt{5}1
    (r"11\sqrt2", r"11\sqrt{2}", True, True),
    ("7.14", r"\sqrt{51}", False, False),
    ("-2,1", "1,-2", True, False),
    ("-2", "-2,1", False, False),
    ("(a+5)(b+2)", "(a+5)(b+2)", True, True),
    ("ab+2a+5b+10", "(a+5)(b+2)", True, False),
    ("26,000", "26000", True, False),
    ("2", "3", False, False),
    ("1", "10", False, False),
    (r"\pi", r"\pi", True, True),
    ("3.14", r"\pi", False, False),
    (r"\{1,2\}", r"\{2,1\}", True, False),
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", True, True),
    (r"\begin{pmatrix} 2 \\ 1 \end{pmatrix}", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", False, False),
    (r"\infty", r"\infty", True, True),
]

# Whole generations: extraction happens first; unboxed answers count as wrong.
GENERATION_CASES = [
    ("The answer is 3.", "3", False, False),
    (r"We get x = 3, so the answer is $3$.", "3", False, False),
    (r"Thus $\boxed{3", "3", False, False),  # cut off by max_new_tokens
    (r"so $x = \boxed{\dfrac{3}{4}}$.", r"\frac{3}{4}", True, True),
    (r"first \boxed{2}, then correcting: \boxed{4}", "4", True, True),
    (r"first \boxed{4}, then correcting: \boxed{2}", "4", False, False),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)", True, True),
]

# The paper's lenient rule: a prediction that is a substring of the answer also counts.
LENIENT_CASES = [
    ("-2", "-2,1", False, True),
    ("1", "10", False, True),
    ("east", r"\text{east}", False, True),
    ("5", "5", True, True),
    ("12", "3", False, False),
]


def test_table_is_large_enough():
    assert len(GRADE_CASES) + len(GENERATION_CASES) >= 40


@pytest.mark.parametrize("prediction,answer,mv,paper", GRADE_CASES)
def test_grade_table(prediction, answer, mv, paper):
    assert lp.grade(prediction, answer) is mv
    assert lp.grade(prediction, answer, method="math-verify") is mv
    assert lp.grade(prediction, answer, method="paper") is paper


@pytest.mark.parametrize("text,answer,mv,paper", GENERATION_CASES)
def test_generation_table(text, answer, mv, paper):
    pred = lp.evals.extract_boxed(text)
    assert lp.grade(pred, answer) is mv
    assert lp.grade(pred, answer, method="paper") is paper


@pytest.mark.parametrize("prediction,answer,strict,lenient", LENIENT_CASES)
def test_lenient_rule(prediction, answer, strict, lenient):
    assert lp.grade(prediction, answer, method="paper") is strict
    assert lp.grade(prediction, answer, method="paper", lenient=True) is lenient
    verdicts = grade_all(prediction, answer)
    assert verdicts["paper"] is strict and verdicts["paper-lenient"] is lenient


def test_lenient_is_off_by_default_and_never_accepts_empty():
    assert lp.grade("1", "10", method="paper") is False
    assert lp.grade("", "10", method="paper", lenient=True) is False
    assert lp.grade(None, "10", method="paper", lenient=True) is False


@pytest.mark.parametrize("text,expected", [
    (r"\boxed{5}", "5"),
    (r"a \boxed{\frac{1}{2}} b", r"\frac{1}{2}"),
    (r"\boxed{\frac{\sqrt{3}}{\left(2\right)}}", r"\frac{\sqrt{3}}{\left(2\right)}"),
    (r"\boxed{1} and \boxed{\{1,2\}}", r"\{1,2\}"),
    (r"\boxed 7$ done", "7"),
    (r"\fbox{8}", "8"),
    (r"\boxed{}", None),
    (r"\boxed{12", None),
    ("no box", None),
    ("", None),
    (None, None),
])
def test_extract_boxed(text, expected):
    assert lp.evals.extract_boxed(text) == expected


def test_normalize_answer_matches_math_rules():
    assert normalize_answer(r"\left( 3, \dfrac{\pi}{2} \right)") == r"(3,\frac{\pi}{2})"
    assert normalize_answer(r"k = \frac12") == r"\frac{1}{2}"
    assert normalize_answer(r"5\text{ cm}") == "5"
    assert normalize_answer(".5") == r"\frac{1}{2}"


@pytest.mark.unchecked
def test_grade_bad_input():
    with pytest.raises(lp.LensprobeError, match="unknown grading method"):
        lp.grade("1", "1", method="exact")
    with pytest.raises(lp.LensprobeError, match="reference answer"):
        lp.grade("1", "")
