"""math-verify's verdicts, pinned: the held cases of test_grading.py plus a table of tricky ones, checked
together so that an upgrade of math-verify that flips any verdict fails with one message naming the
installed version and every case that changed."""

from importlib.metadata import version

import lensprobe as lp

# (prediction, reference answer, math-verify verdict), recorded with math-verify 0.9.
TRICKY_CASES = [
    (r"\frac{1}{2}", "0.5", True),
    ("1,000", "1000", True),
    (r"50\%", "50", True),
    ("50%", "50", True),
    ("x^2+2x+1", "(x+1)^2", True),
    (r"\sqrt{8}", r"2\sqrt{2}", True),
    (r"3\sqrt{3}", r"\sqrt{27}", True),
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", True),
    (r"\frac{6}{8}", r"\frac34", True),
    ("10^{-3}", "0.001", True),
    ("2^{10}", "1024", True),
    (r"\log_2 8", "3", True),
    (r"\sin(\pi/6)", r"\frac12", True),
    (r"\binom{5}{2}", "10", True),
    ("5!", "120", True),
    ("1:2", r"\frac12", True),
    ("0.1", "1/10", True),
    ("3.0", "3", True),
    ("-0", "0", True),
    ("a=2,b=3", "(2,3)", True),
    ("x=1 or x=2", "1,2", True),
    ("y=2x+1", "2x+1", True),
    (r"x \in (0,1)", "(0,1)", True),
    ("(1,2)", r"\{1,2\}", True),
    (r"\emptyset", r"\{\}", True),
    (r"\text{Monday}", "Monday", True),
    (r"\$5", "5", True),
    (r"10^\circ", "10", True),
    ("3x", "x3", True),
    (r"2\pi", "6.28", False),
    ("3.01", "3", False),
    ("0.333", r"\frac{1}{3}", False),
    (r"\frac{1}{3}", r"0.\overline{3}", False),
    (r"\infty", r"-\infty", False),
    ("[1,2]", "[1,2)", False),
    ("1e3", "1000", False),
    ("i", r"\sqrt{-1}", False),
    ("5 dollars", "5", False),
    ("", "3", False),
]


def held_cases() -> list[tuple[str, str, bool]]:
    """The judged cases of test_grading.py (math-verify's column), as (prediction, answer, verdict)."""
    from test_grading import GRADE_CASES

    return [(pred, ans, mv) for pred, ans, mv, _ in GRADE_CASES]


def test_math_verify_verdicts_are_the_recorded_ones():
    cases = TRICKY_CASES + held_cases()
    assert len(cases) >= 90 and len({(p, a) for p, a, _ in cases}) >= 85
    flipped = [f"  grade({pred!r}, {ans!r}) is {not want}, recorded {want}"
               for pred, ans, want in cases if lp.grade(pred, ans, method="math-verify") is not want]
    assert not flipped, (f"math-verify {version('math-verify')} changed {len(flipped)} of {len(cases)} recorded "
                         "verdicts (pyproject.toml pins the major version; review these and the README's grader "
                         "table before accepting it):\n" + "\n".join(flipped))
