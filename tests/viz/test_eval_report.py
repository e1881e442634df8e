"""Evaluation figures and the evaluation report section, from hand-made result rows."""

import pandas as pd
import pytest

import lensprobe as lp
from lensprobe.evals import accuracy
from lensprobe.evals.results.stats import summary_tables
from lensprobe.viz.eval_report import results_section
from lensprobe.viz.evals import accuracy_bars, accuracy_by_level


def fake_rows():
    recs = []
    verdicts = {
        ("m1", "w/o"): [1, 0, 0, 1, 0, 1],
        ("m1", "w/ Mless"): [1, 1, 0, 1, 0, 1],
        ("m2", "w/o"): [0, 0, 0, 1, 0, 0],
        ("m2", "w/ Mless"): [0, 1, 0, 1, 1, 0],
    }
    for (model, cond), vs in verdicts.items():
        for i, v in enumerate(vs):
            recs.append({"model": model, "condition": cond, "problem_id": f"p{i}", "sample": 0,
                         "level": 1 + i % 2, "subject": "A", "math-verify": bool(v), "paper": bool(v),
                         "paper-lenient": True, "finish": "eos"})
    return pd.DataFrame.from_records(recs)


def test_accuracy_bars_draw_the_table():
    table = accuracy(fake_rows(), ["model", "condition"])
    fig = accuracy_bars(table)
    assert [t.name for t in fig.data] == ["w/o", "w/ Mless"]
    for trace in fig.data:
        rows = table[table["condition"] == trace.name]
        assert list(trace.x) == ["m1", "m2"]
        assert list(trace.y) == pytest.approx(list(rows["accuracy"] * 100))
        assert list(trace.error_y.array) == pytest.approx(list((rows["high"] - rows["accuracy"]) * 100))
        assert list(trace.error_y.arrayminus) == pytest.approx(list((rows["accuracy"] - rows["low"]) * 100))
    assert fig.layout.barmode == "group"


def test_accuracy_by_level_one_panel_per_model():
    table = accuracy(fake_rows(), ["model", "condition", "level"])
    fig = accuracy_by_level(table)
    assert len(fig.data) == 4  # 2 models x 2 conditions
    first = fig.data[0]
    rows = table[(table["model"] == "m1") & (table["condition"] == "w/o")].sort_values("level")
    assert list(first.x) == [1, 2] and list(first.y) == pytest.approx(list(rows["accuracy"] * 100))


def test_summary_tables_and_section():
    rows = fake_rows()
    tables = summary_tables(rows)
    acc = tables["accuracy"]
    assert set(acc["grader"]) == {"math-verify", "paper", "paper-lenient"}
    m1 = acc[(acc["model"] == "m1") & (acc["grader"] == "math-verify")]
    assert list(m1["accuracy"]) == pytest.approx([3 / 6, 4 / 6])
    cmp = tables["comparisons"]
    row = cmp[(cmp["model"] == "m2") & (cmp["grader"] == "math-verify")].iloc[0]
    assert (row["a"], row["b"], row["only_a"], row["only_b"]) == ("w/o", "w/ Mless", 0, 2)
    sec = results_section(rows, title="t")
    assert len(sec.figures) == 2 and "McNemar" in sec.intro and "Wilson" in sec.intro
    with pytest.raises(lp.LensprobeError, match="baseline"):
        summary_tables(rows, baseline="w/ Mful")


def test_the_report_of_an_arithmetic_run_says_what_ran(tiny, tmp_path):
    """A run on the arithmetic set read by last number: no MATH-500 or \\boxed{} wording anywhere in its report."""
    probs = lp.evals.arithmetic_problems(n=4, seed=0)
    lp.evaluate(tiny, probs, "w/o,w/ Mless", out=tmp_path / "run", max_new_tokens=3, extract="last-number",
                model_name="tiny", progress=False)
    index = lp.viz.write_eval_report(tmp_path / "run", tmp_path / "report")
    page = index.read_text(encoding="utf-8")
    assert "MATH-500" not in page and "\\boxed{" not in page and "\\\\boxed{" not in page
    assert "Arithmetic problems: accuracy per condition" in page and "last number of the generated text" in page
    assert "<dt>answers read by</dt><dd>last-number</dd>" in page
    facts = lp.evals.run_facts(lp.evals.load_results(tmp_path / "run"))
    assert (facts.problems, facts.extract, facts.models, facts.n_problems) == (
        "Arithmetic problems", ("last-number",), ("tiny",), 4)


def test_the_facts_of_math500_rows_read_by_box():
    rows = lp.evals.results.runfacts.mark_extract(pd.DataFrame({
        "problem_id": [p.id for p in lp.load_math500(limit=2)], "condition": "w/o", "model": "m",
        "math-verify": [True, False]}), "boxed")
    facts = lp.evals.run_facts(rows)
    assert facts.title == "MATH-500: accuracy per condition" and "\\boxed{...}" in facts.extraction_note
    assert lp.evals.run_facts(rows.assign(problem_id=["a", "b"])).problems == "Problems"
