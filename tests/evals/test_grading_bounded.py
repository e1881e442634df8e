"""Graders are bounded and honest: equal answers need no maths, a timeout is no verdict (``None``, never
``False``), the timeout is a setting, and the log shows an excerpt of the answers, not the answers."""

import logging

import pytest

import lensprobe as lp
from lensprobe.core.storage.identity import identity
from lensprobe.evals.grading import grade as grading
from lensprobe.evals.grading.mathverify import excerpt

SLOW = "(10^{6})!"  # sympy evaluates this factorial for many seconds


def test_identical_answers_are_equal_without_math_verify(monkeypatch):
    def refuse(*args):
        raise AssertionError("math-verify was called")

    monkeypatch.setattr(grading, "math_verify_equiv", refuse)
    big = "x+" * 500_000 + "1"  # a 1 MB answer
    assert lp.grade(big, big) is True
    assert lp.grade(r"\dfrac{1}{2}", r"\frac12") is True  # equal after normalisation
    assert lp.evals.grade_all(big, big)["math-verify"] is True


def test_a_long_sum_is_parsed_not_dropped():
    # math-verify's parser recurses once per term; the time limit is generous (the claim is the parse, not its
    # speed: the default 5 s per step is too short on a loaded machine)
    assert lp.grade("+".join(["1"] * 1000), "1000", timeout=60) is True


def test_a_timeout_is_no_verdict_with_a_short_log_line(caplog):
    with caplog.at_level(logging.DEBUG):
        verdict = lp.grade(SLOW + "+" + "1" * 500, "1", timeout=1)
    assert verdict is None  # timed out: neither right nor wrong
    lines = [r.getMessage() for r in caplog.records]
    assert any("math-verify timed out (1 s per step)" in line and "no verdict" in line for line in lines), lines
    assert all(len(line) < 300 for line in lines), lines  # an excerpt, never the whole input
    assert not any("1" * 500 in line for line in lines)


def test_grade_all_keeps_the_timeout_and_the_string_graders_their_verdicts():
    verdicts = lp.evals.grade_all(SLOW, "1", timeout=1)
    assert verdicts == {"math-verify": None, "paper": False, "paper-lenient": False}


@pytest.mark.unchecked
@pytest.mark.parametrize("timeout", [0, -1, 0.5, True, "5"])
def test_a_bad_timeout_is_refused(timeout):
    with pytest.raises(lp.LensprobeError, match="timeout must be a whole number of seconds >= 1"):
        lp.grade("1", "1", timeout=timeout)


@pytest.mark.unchecked
@pytest.mark.parametrize("prediction", [3, 3.0, ["3"]])
def test_a_prediction_that_is_not_text_is_refused(prediction):
    with pytest.raises(lp.LensprobeError, match="the prediction must be a string or None"):
        lp.grade(prediction, "3")


def test_excerpt_cuts_and_says_the_length():
    assert excerpt("short") == "'short'"
    assert excerpt("a" * 100, 10) == "'aaaaaaaaaa' ... (100 characters)"


def test_the_grade_timeout_is_a_setting_of_the_run_identified_default_included():
    from lensprobe.evals.grading.mathverify import GRADE_TIMEOUT

    assert lp.evals.EvalConfig().grade_timeout == GRADE_TIMEOUT
    assert identity(lp.evals.EvalConfig())["grade_timeout"] == GRADE_TIMEOUT  # a default is recorded
    assert identity(lp.evals.EvalConfig(grade_timeout=GRADE_TIMEOUT)) == identity(lp.evals.EvalConfig())
    assert identity(lp.evals.EvalConfig(grade_timeout=30))["grade_timeout"] == 30
    assert identity(lp.evals.EvalConfig(grade_timeout=None))["grade_timeout"] is None  # no limit
    with pytest.raises(lp.LensprobeError, match="timeout must be a whole number of seconds >= 1"):
        lp.evals.EvalConfig(grade_timeout=0)


def test_evaluate_grades_with_the_runs_timeout(tiny, monkeypatch):
    from lensprobe.evals.running import execute as running

    seen = []

    def spy(prediction, answer, *, timeout):
        seen.append(timeout)
        return dict.fromkeys(grading.GRADERS, False)

    monkeypatch.setattr(running, "grade_all", spy)
    problem = lp.evals.Problem(id="q0", problem="What is 1+1?", answer="2")
    lp.evaluate(tiny, [problem], "w/o", max_new_tokens=2, grade_timeout=17, progress=False)
    assert seen == [17]


def test_the_eval_command_passes_grade_timeout_to_grading_and_records_it(tmp_path, monkeypatch):
    import json

    from lensprobe.app.cli import main
    from lensprobe.evals.running import execute as running

    seen = []
    real = running.grade_all
    monkeypatch.setattr(running, "grade_all", lambda p, a, *, timeout: seen.append(timeout) or real(p, a, timeout=timeout))
    out = tmp_path / "run"
    argv = ["eval", "--model", "tiny", "--problems", "arithmetic", "--limit", "1", "--conditions", "w/o",
            "--max-new-tokens", "2", "--grade-timeout", "9", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    assert seen and set(seen) == {9}
    assert json.loads((out / "config.json").read_text())["settings"]["generation"]["grade_timeout"] == 9
