"""The latent-thinking study: traces of several thinking settings and their two-panel figure (tiny model).

The ``lensprobe trace`` command is tested in ``tests/app/test_cli.py``, the demo section in
``tests/app/test_demo.py``.
"""

import pytest

import lensprobe as lp
from lensprobe.studies.thinking import compare_thinking, with_thinking_token


def test_generation_trace_figure_draws_the_summary(tiny):
    model = with_thinking_token(tiny)
    p = lp.build_prompt(model, "What is 2+3?")
    traces = compare_thinking(model, p, ["fusion", "pause"], max_new_tokens=10,
                              think_when=lp.generation.schedule.every(3), n_samples=3, do_sample=True, seed=0,
                              stop_at_eos=False)
    df = lp.generation.trace_summary(traces, band="ci95")
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
