"""The latent-thinking study: CLI `lensprobe trace`, the demo section and the two-panel figure (tiny model)."""

import json

import pandas as pd
import pytest

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.app.sections.thinking import build_demo_section
from lensprobe.generation.schedule import parse_schedule
from lensprobe.studies.thinking import compare_thinking, with_thinking_token


def test_cli_trace_writes_traces_summary_and_figure(tmp_path, capsys):
    out = tmp_path / "trace"
    rc = main(["trace", "--model", "tiny", "--question", "What is 2+3?", "--max-new-tokens", "12",
               "--think", "fusion,pause,none", "--schedule", "first:2+every:4", "--out", str(out)])
    assert rc == 0
    cap = capsys.readouterr()
    assert "tok/s" in cap.err  # the progress bar reports tokens per second
    names = {"trace-latentfusion-alpha-0-6.parquet", "trace-pause.parquet", "trace-no-thinking.parquet",
             "summary.csv", "texts.csv", "trace.html", "plotly.min.js"}
    assert names <= {p.name for p in out.iterdir()}
    fusion = lp.load_trace(out / "trace-latentfusion-alpha-0-6.parquet")
    assert fusion.thinking.nonzero().flatten().tolist() == [0, 1, 3, 7, 11]
    assert fusion.meta["thinking"]["alpha"] == 0.6 and set(fusion.attention) == {"system", "question", "thinking"}
    none = lp.load_trace(out / "trace-no-thinking.parquet")
    assert not none.thinking.any() and "thinking" not in none.attention
    summary = pd.read_csv(out / "summary.csv")
    ent = summary.query("condition == 'Pause' and metric == 'entropy'").sort_values("step")["mean"]
    pause = lp.load_trace(out / "trace-pause.parquet")
    assert ent.tolist() == pytest.approx(pause.entropy[: len(ent)].tolist(), abs=1e-5)
    assert set(summary.query("metric == 'attention'")["condition"]) == {"LatentFusion (alpha=0.6)", "Pause"}
    assert "trace.html" in cap.out


def test_cli_trace_json_and_bad_input(tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["trace", "--model", "tiny", "--question", "Hi", "--max-new-tokens", "3", "--think", "none",
                 "--format", "json", "--out", str(out)]) == 0
    body = json.loads((out / "trace-no-thinking.json").read_text())
    assert body["format"] == "lensprobe.GenerationTrace" and body["n_rows"] == 1
    capsys.readouterr()
    assert main(["trace", "--model", "tiny", "--question", "Hi", "--think", "bogus", "--out", str(out)]) == 2
    assert "unknown thinking setting 'bogus'" in capsys.readouterr().err
    assert main(["trace", "--model", "tiny", "--question", "Hi", "--schedule", "every:x", "--out", str(out)]) == 2
    assert "cannot read schedule part" in capsys.readouterr().err
    assert main(["trace", "--model", "tiny", "--question", "Hi", "--max-new-tokens", "100000",
                 "--out", str(out)]) == 2
    assert "exceeds the model's context" in capsys.readouterr().err


def test_parse_schedule():
    assert parse_schedule("every:8") == lp.schedule.every(8)
    assert parse_schedule("emitted") == lp.schedule.emitted()
    combo = parse_schedule("first:2 + at:5,9")
    assert isinstance(combo, lp.schedule.AnyOf) and len(combo.rules) == 2
    with pytest.raises(lp.LensprobeError):
        parse_schedule("sometimes")


def test_demo_section_quick_does_not_touch_the_shared_model(tiny):
    vocab = tiny.cfg.d_vocab
    sec = build_demo_section(tiny, quick=True)
    assert tiny.cfg.d_vocab == vocab and len(tiny.tokenizer) == vocab  # worked on a copy
    assert "never trained" in sec.intro and "&lt;thinking&gt;" in sec.intro
    assert len(sec.figures) == 1 and {"per_step", "texts"} <= set(sec.tables)
    per_step = sec.tables["per_step"]
    assert set(per_step["condition"]) == {"LatentFusion (alpha=0.6)", "Pause", "no thinking"}
    assert sec.data["summary"]["settings"]["steps"] == 8


def test_generation_trace_figure_draws_the_summary(tiny):
    model = with_thinking_token(tiny)
    p = lp.build_prompt(model, "What is 2+3?")
    traces = compare_thinking(model, p, ["fusion", "pause"], max_new_tokens=10,
                              think_when=lp.schedule.every(3), n_samples=3, do_sample=True, seed=0,
                              stop_at_eos=False)
    df = lp.trace_summary(traces, band="ci95")
    fig = lp.viz.generation_trace_figure(df, title="t")
    lines = [t for t in fig.data if t.mode == "lines"]
    bands = [t for t in fig.data if t.fill == "toself"]
    assert len(lines) == 4 and len(bands) == 4  # 2 conditions x 2 panels
    ent = df.query("condition == 'Pause' and metric == 'entropy'").sort_values("step")
    line = next(t for t in lines if t.name == "Pause" and t.xaxis == "x")
    assert list(line.y) == pytest.approx(ent["mean"].tolist())
    band = next(t for t in bands if t.legendgroup == "Pause" and t.xaxis == "x")
    assert list(band.y[: len(ent)]) == pytest.approx(ent["upper"].tolist())
    assert "attention proportion onto thinking" in fig.layout.annotations[1].text
