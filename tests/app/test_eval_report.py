"""Evaluation figures, report section and demo section; the harness on the embedded SmolLM2."""

import pandas as pd
import pytest
import torch

import lensprobe as lp
from lensprobe.app.sections.evals import build_demo_section
from lensprobe.evals import accuracy, builtin_condition
from lensprobe.evals.stats import summary_tables
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


def test_demo_section_quick_on_tiny(tiny):
    sec = build_demo_section(tiny, quick=True)
    assert "135M" in sec.intro and "solves very few" in sec.intro
    answers = sec.tables["answers"]
    assert sorted(set(answers["condition"])) == ["w/ Mful", "w/ Mless", "w/o"]
    assert answers["problem_id"].nunique() == 2


def test_smol_batched_equals_unbatched_and_transformers(smol, math500_path):
    probs = lp.load_math500(math500_path, levels=1, limit=2)
    assert len(probs[0].problem) != len(probs[1].problem)  # different lengths: the batch is padded
    one = lp.evaluate(smol, probs, "w/ Mless", max_new_tokens=16, batch_size=1, progress=False)
    many = lp.evaluate(smol, probs, "w/ Mless", max_new_tokens=16, batch_size=2, progress=False)
    cols = ["condition", "problem_id", "generation", "generated_tokens", "finish", "prediction", "math-verify"]
    assert one[cols].equals(many[cols])
    # Oracle: transformers' greedy generate on the same prompt.
    prompt = builtin_condition("w/ Mless").prompt_builder(smol)(probs[1].problem)
    hf = smol.original_model
    out = hf.generate(prompt.tokens, attention_mask=torch.ones_like(prompt.tokens), max_new_tokens=16,
                      do_sample=False, eos_token_id=smol.tokenizer.eos_token_id,
                      pad_token_id=smol.tokenizer.pad_token_id)
    ids = out[0, prompt.tokens.shape[1]:].tolist()
    row = many[(many["condition"] == "w/ Mless") & (many["problem_id"] == probs[1].id)].iloc[0]
    assert row["generated_tokens"] == len(ids)
    assert row["generation"] == smol.tokenizer.decode(ids[:-1] if row["finish"] == "eos" else ids)
