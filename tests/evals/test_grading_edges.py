r"""The graders' edges the tables of test_grading*.py do not reach: the MATH normalisation's rarer rules
(a second ``\frac``, ``\frac1{2}``, three characters before ``=``, line breaks, ``\\``, ``" ."`` and ``"{."``),
its non-strict answers where the authors' version raises, math-verify's lenient fallback, the timeout
``grade_all`` passes on, and the exact messages. Every expected string is written out by hand from the rules
in the docstrings of :mod:`lensprobe.evals.grading.grade`."""

import re

import pytest

import lensprobe as lp
from lensprobe.evals.grading import grade as grading
from lensprobe.evals.grading.grade import (
    PaperGraderError,
    grade,
    grade_all,
    normalize_answer,
    normalize_answer_paper_exact,
)


class MathVerifySpy:
    """Stands in for math-verify: records each call and gives the verdict it was set up with."""

    def __init__(self, verdict):
        self.verdict = verdict
        self.calls = []

    def __call__(self, prediction, answer, timeout):
        self.calls.append((prediction, answer, timeout))
        return self.verdict


@pytest.fixture
def spy(monkeypatch):
    def install(verdict):
        fake = MathVerifySpy(verdict)
        monkeypatch.setattr(grading, "math_verify_equiv", fake)
        return fake
    return install


@pytest.mark.parametrize(("text", "expected"), [
    (r"\frac{1}{2}+\frac{3}{4}", r"\frac{1}{2}+\frac{3}{4}"),  # the piece after a braced \frac goes on
    (r"\frac12+1", r"\frac{1}{2}+1"),  # what follows the two digits is kept whole
    (r"\frac1{2}", r"\frac{1}{2}"),  # a single digit numerator before a braced denominator
    (r"\frac1{2}+3", r"\frac{1}{2}+3"),
    ("abc=3", "abc=3"),  # three characters before "=" are no short prefix: kept
    ("ab=3", "3"),
    ("1\n2", "12"),  # line breaks removed
    (r"a\\b", r"a\b"),  # "\\" made "\"
    ("1 + .5", "1+0.5"),  # " ." made " 0."
    (r"\frac{.5}{2}", r"\frac{0.5}{2}"),  # "{." made "{0."
    (r"3\frac", r"3\frac"),  # nothing after \frac: the non-strict rule leaves the string
    (r"2\sqrt", r"2\sqrt"),
])
def test_the_math_normalisation_applies_each_rule(text, expected):
    assert normalize_answer(text) == expected


def test_the_paper_grader_tells_apart_what_only_the_rarer_rules_tell_apart():
    assert grade(r"\frac{1}{2}+\frac{3}{4}", r"\frac{1}{2}+\frac{1}{4}", method="paper") is False
    assert grade(r"\frac1{2}", r"\frac{1}{2}", method="paper") is True
    assert grade("abc=3", "3", method="paper") is False


def test_the_authors_normalisation_raises_indexerror_with_pythons_own_message():
    for text in (r"3\frac", r"2\sqrt", r"\frac\frac12"):
        with pytest.raises(IndexError) as caught:
            normalize_answer_paper_exact(text)
        assert str(caught.value) == "string index out of range"


def test_several_unit_groups_are_refused_by_the_normalisation_and_compared_as_written():
    units = r"5\text{ m}\text{ s}"
    with pytest.raises(ValueError) as caught:
        normalize_answer(units)
    assert str(caught.value) == "several unit groups"
    # the paper grader then compares the strings as written: equal, and not equal
    assert grade(units, units, method="paper") is True
    assert grade(units, r"6\text{ m}\text{ s}", method="paper") is False
    assert grade(r"5\text{ m}", units, method="paper") is False


def test_answers_the_normalisation_cannot_read_go_to_math_verify(spy):
    fake = spy(False)
    assert grade(r"5\text{ m}\text{ s}", r"6\text{ m}\text{ s}") is False
    assert fake.calls == [(r"5\text{ m}\text{ s}", r"6\text{ m}\text{ s}", 5)]


def test_math_verify_wrong_then_lenient_accepts_a_substring_of_the_normalised_answer(spy):
    fake = spy(False)
    assert grade(" 1 ", "10", lenient=True) is True  # "1" is a substring of "10"
    assert grade("1", "10") is False  # not lenient: math-verify's verdict
    assert grade(r"\dfrac{1}{2}", r"\frac{1}{2}+1", lenient=True) is True  # after normalising both
    assert grade("12", "10", lenient=True) is False
    assert fake.calls[0] == ("1", "10", 5)  # the prediction stripped before math-verify


def test_math_verify_right_or_timed_out_is_not_overruled_by_the_lenient_rule(spy):
    spy(None)
    assert grade("1", "10", lenient=True) is None  # a timeout stays no verdict
    spy(True)
    assert grade("12", "10", lenient=True) is True


def test_grade_all_passes_its_timeout_to_math_verify(spy):
    fake = spy(False)
    assert grade_all("2", "3", timeout=17) == {"math-verify": False, "paper": False, "paper-lenient": False}
    assert fake.calls == [("2", "3", 17)]


@pytest.mark.unchecked
def test_a_prediction_that_is_not_text_is_refused_with_its_type_named():
    message = "the prediction must be a string or None (nothing extracted), got int 3."
    with pytest.raises(lp.LensprobeError, match=f"^{re.escape(message)}$"):
        grade(3, "3")


def test_the_paper_exact_grader_says_why_it_gives_no_verdict():
    message = (r"the authors' grader (is_equiv) raises on the boxed answer '3\\frac' or the reference '3': a \frac "
               r"or \sqrt with nothing after it (IndexError in their _fix_fracs/_fix_sqrt), so their script would "
               "stop here; no verdict")
    with pytest.raises(PaperGraderError) as caught:
        grade(r"so \boxed{3\frac}", "3", method="paper-exact")
    assert str(caught.value) == message
