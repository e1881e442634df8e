r"""Where the authors' ``is_equiv`` raises (a ``\frac`` or ``\sqrt`` with nothing after it: an ``IndexError`` in
their ``_fix_fracs`` / ``_fix_sqrt``, which their MATH-500 loop does not catch), ``paper-exact`` gives no verdict:
the grader raises ``PaperGraderError`` and an evaluation writes an error row saying why, never a verdict from
comparing the raw strings."""

import pytest

import lensprobe as lp
from lensprobe.evals.grading.grade import PaperGraderError, grade_paper_exact
from lensprobe.evals.problems.load import Problem


def authors_fix_raises(string: str) -> bool:
    r"""Whether their ``_fix_sqrt`` or ``_fix_fracs`` indexes an empty piece: ``split[0]`` after ``\sqrt``,
    ``substr[0]`` after ``\frac`` (spaces are removed between the two, as their ``_strip_string`` does)."""
    if any(piece == "" for piece in string.split("\\sqrt")[1:]):
        return True
    return any(piece == "" for piece in string.replace(" ", "").split("\\frac")[1:])


ANSWERS = [r"3\frac", r"2\sqrt", r"\frac\frac12", r"\sqrt\sqrt2", r"x \frac", r"\frac12", r"\sqrt2", r"\frac{1}{2}",
           r"3\sqrt{2}", "7"]


@pytest.mark.parametrize("boxed", ANSWERS)
def test_paper_exact_raises_where_the_authors_grader_raises(boxed):
    text = "so the answer is \\boxed{" + boxed + "}."
    if authors_fix_raises(boxed):
        with pytest.raises(PaperGraderError, match=r"is_equiv\) raises on the boxed answer .*no verdict"):
            grade_paper_exact(text, "3")
        with pytest.raises(PaperGraderError):
            grade_paper_exact("\\boxed{3}", boxed)  # on the reference answer too
    else:
        assert grade_paper_exact(text, boxed) is True


def test_an_evaluation_writes_an_error_row_where_the_authors_script_would_stop(tiny, tmp_path):
    """The paper format grades prompt + generation, so the prompt's own ``\\boxed{{}}`` is read when nothing
    else is boxed, and the reference ``1\\frac`` is normalised: the authors' grader raises on every row."""
    bad = Problem(id="bad", problem="What is 1?", answer=r"1\frac")
    good = Problem(id="good", problem="What is 2?", answer="2")
    with pytest.warns(lp.evals.ErrorRowsWarning):
        rows = lp.evaluate(tiny, [bad, good], "w/o", out=tmp_path / "run", prompt_format="paper", max_new_tokens=2,
                           progress=False)
    by_id = rows.set_index("problem_id")
    assert by_id.loc["bad", "finish"] == "error" and "PaperGraderError" not in by_id.loc["bad", "error"]
    assert "is_equiv) raises" in by_id.loc["bad", "error"]
    assert by_id.loc["bad", ["prediction", "paper-exact", "math-verify"]].isna().all()
    assert by_id.loc["good", "finish"] != "error" and by_id.loc["good", "paper-exact"] is not None
    assert lp.evals.load_results(tmp_path / "run").set_index("problem_id").loc["bad", "finish"] == "error"


@pytest.mark.parametrize("protocol", ["arm-math500", "arm-aime-pass3", "arm-aime-pass3-text"])
def test_the_pass3_protocols_count_it_wrong_as_the_pass3_loop_does(tiny, protocol):
    """Their pass@3 loop wraps is_equiv in ``try: ... except Exception: ok = False``; their MATH-500 loop does not."""
    from lensprobe.core.prompts.conditions import Condition
    from lensprobe.evals.running.execute import Item, RunInfo, make_row
    from lensprobe.evals.running.protocols import get_protocol, ungradable_is_wrong

    item = Item(problem=Problem(id="p", problem="What is 3?", answer="3"), sample=0,
                prompt=lp.build_prompt(tiny, "What is 3?", template="raw"))
    info = RunInfo("tiny", None, {"w/o": None}, 0)
    row = make_row(item, Condition("w/o"), [5, 6], r"so \boxed{3\frac}", "eos", 0.1, info,
                   exact_on_prompt=get_protocol(protocol).grade_prompt, ungradable_wrong=ungradable_is_wrong(protocol))
    if protocol.startswith("arm-aime-pass3"):
        assert (row["finish"], row["paper-exact"], row["error"]) == ("eos", False, None)
        assert row["prediction"] == r"3\frac" and row["math-verify"] is not None  # the other graders grade it
    else:
        assert (row["finish"], row["paper-exact"], row["prediction"]) == ("error", None, None)
        assert "is_equiv) raises" in row["error"]
