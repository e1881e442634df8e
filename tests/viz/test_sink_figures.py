"""Sink and activation-norm figures: what they draw equals the tables' numbers (hand-made tables, and a real
trace of the tiny model), and every heatmap cell and title line fits the figure's own size."""

import pandas as pd
import pytest
import torch

import lensprobe as lp
from lensprobe.viz import activation_norm_figure, massive_activation_figure, sink_heatmap, sink_steps_figure
from lensprobe.viz.style import CONDITION_COLORS, INDEX_NOTE

FIRST = "first token"


def prompt_table(conditions=("w/o", "w/ Mless"), layers=3, heads=4):
    rows = []
    for c, cond in enumerate(conditions):
        for layer in range(layers):
            for h in range(heads):
                rows.append((cond, layer, h, f"L{layer}H{h}", FIRST, 0.1 * layer + 0.01 * h + 0.001 * c, 9))
                if cond != "w/o":
                    rows.append((cond, layer, h, f"L{layer}H{h}", "filler", 0.2 + 0.01 * h, 5))
    return pd.DataFrame(rows, columns=["condition", "layer", "head", "head_label", "target", "mass", "queries"])


def cell_size(fig, axis: int, n_cols: int, n_rows: int) -> tuple[float, float]:
    """Pixels per heatmap cell of panel ``axis`` (1-based) from the figure's own size and margins."""
    lay = fig.layout
    plot_w = lay.width - lay.margin.l - lay.margin.r
    plot_h = lay.height - lay.margin.t - lay.margin.b
    xd = (lay["xaxis" if axis == 1 else f"xaxis{axis}"].domain)
    yd = (lay["yaxis" if axis == 1 else f"yaxis{axis}"].domain)
    return plot_w * (xd[1] - xd[0]) / n_cols, plot_h * (yd[1] - yd[0]) / n_rows


def assert_title_fits(fig):
    """Each line of the title's note fits the figure's width (about 6 px per character at that size)."""
    note = fig.layout.title.text.split("<sup>")[1].split("</sup>")[0]
    width = fig.layout.width or 700
    assert all(len(line) * 6 <= width - 100 for line in note.split("<br>")), note


def test_sink_heatmap_draws_each_conditions_grid_with_one_scale_and_fits():
    table = prompt_table(layers=30, heads=9)
    fig = sink_heatmap(table)
    assert [t.type for t in fig.data] == ["heatmap", "heatmap"]
    for t, cond in zip(fig.data, ("w/o", "w/ Mless"), strict=True):
        want = table[(table["condition"] == cond) & (table["target"] == FIRST)]
        for layer in (0, 17, 29):
            for h in (0, 8):
                got = t.z[layer][h]
                assert got == pytest.approx(float(want[(want["layer"] == layer) & (want["head"] == h)]["mass"].iloc[0]))
        assert list(t.y) == list(range(30)) and list(t.x) == list(range(9))
        assert t.zmin == 0.0
    assert fig.data[0].zmax == fig.data[1].zmax == pytest.approx(table[table["target"] == FIRST]["mass"].max())
    assert [t.showscale for t in fig.data] == [False, True]
    assert [a.text for a in fig.layout.annotations][:2] == ["w/o filler", "Mless"]
    for axis in (1, 2):
        w, h = cell_size(fig, axis, 9, 30)
        assert w >= 20 and h >= 12, (w, h)
    assert INDEX_NOTE in fig.layout.title.text
    assert_title_fits(fig)


def test_sink_heatmap_of_a_segment_leaves_out_conditions_without_it():
    fig = sink_heatmap(prompt_table(("w/o", "w/ Mless", "w/ Mful")), target="filler", zmax=1.0)
    assert [t.name for t in fig.data] == ["w/ Mless", "w/ Mful"] and fig.data[0].zmax == 1.0
    with pytest.raises(lp.LensprobeError, match="no target 'question'"):
        sink_heatmap(prompt_table(), target="question")
    with pytest.raises(lp.LensprobeError, match=r"columns \['mass'\]"):
        sink_heatmap(prompt_table().drop(columns="mass"))


def step_table():
    rows = []
    for cond in ("w/o", "w/ Mless"):
        for layer in range(10):
            for step in range(5):
                rows.append((cond, step, 40 + step, f"t{step}", layer, FIRST, 0.5 + 0.01 * step - 0.1 * (cond == "w/o"),
                             0.01))
    return pd.DataFrame(rows, columns=["condition", "step", "position", "token", "layer", "target", "mass", "sd"])


def test_sink_steps_figure_draws_a_line_per_condition_and_a_panel_per_layer():
    table = step_table()
    fig = sink_steps_figure(table, layers=[2, 7])
    assert [a.text for a in fig.layout.annotations] == ["layer 2", "layer 7"]
    assert [t.name for t in fig.data] == ["w/o filler", "Mless", "w/o filler", "Mless"]
    assert [t.showlegend for t in fig.data] == [True, True, False, False]
    want = table[(table["layer"] == 7) & (table["condition"] == "w/ Mless")].sort_values("step")
    assert list(fig.data[3].y) == pytest.approx(want["mass"].tolist())
    assert list(fig.data[3].x) == [0, 1, 2, 3, 4] and list(fig.data[3].customdata) == [f"t{i}" for i in range(5)]
    assert fig.data[0].line.color == CONDITION_COLORS["w/o"]
    assert fig.layout.height >= 140 + 170 * 2
    default = sink_steps_figure(table)  # at most six layers, spread from the first to the last
    assert [a.text for a in default.layout.annotations] == [f"layer {v}" for v in (0, 2, 4, 5, 7, 9)]
    with pytest.raises(lp.LensprobeError, match=r"layers \[12\] are not in the table"):
        sink_steps_figure(table, layers=[12])


def massive_table():
    rows = []
    for cond, scale in (("w/o", 1.0), ("w/ Mless", 2.0)):
        for layer in range(4):
            for rank in range(2):
                mag = scale * (10.0 ** layer) / (rank + 1)
                rows.append((cond, "prompt", pd.NA, 0, "<s>", layer, rank, 7 + rank, -mag, mag, 0.5, mag / 0.5))
                rows.append((cond, "step", 1, 30, "x", layer, rank, 3, mag, mag, 1.0, mag))
    t = pd.DataFrame(rows, columns=["condition", "phase", "step", "position", "token", "layer", "rank", "dim", "value",
                                    "magnitude", "median", "ratio"])
    t["step"] = t["step"].astype("Int64")
    return t


def test_massive_activation_figure_draws_the_largest_entrys_ratio_per_layer():
    table = massive_table()
    fig = massive_activation_figure(table)
    assert [t.name for t in fig.data] == ["w/o filler", "Mless"]
    want = table[(table["phase"] == "prompt") & (table["rank"] == 0) & (table["condition"] == "w/ Mless")]
    assert list(fig.data[1].y) == pytest.approx(want["ratio"].tolist()) and list(fig.data[1].x) == [0, 1, 2, 3]
    assert list(fig.data[1].customdata[2]) == ["<s>", 0, 7, pytest.approx(-200.0)]  # token, position, dim, value
    assert fig.layout.yaxis.type == "log" and "over the prompt" in fig.layout.title.text
    step = massive_activation_figure(table, phase="step", step=1, log_y=False)
    assert list(step.data[0].y) == pytest.approx([1.0, 10.0, 100.0, 1000.0]) and step.layout.yaxis.type == "linear"
    with pytest.raises(lp.LensprobeError, match="no step rows at step 4"):
        massive_activation_figure(table, phase="step", step=4)
    with pytest.raises(lp.LensprobeError, match="phase must be"):
        massive_activation_figure(table, phase="steps")


@pytest.fixture(scope="module")
def traces(tiny):
    p = lp.build_prompt(tiny, "What is 2+3?")
    full = lp.trace_generation(tiny, p, max_new_tokens=5, stop_at_eos=False, record="blocks.*.hook_resid_post")
    norms = lp.trace_generation(tiny, p, max_new_tokens=5, stop_at_eos=False,
                                record=lp.Record("blocks.*.hook_resid_post", reduce=lambda x: x.norm(dim=-1)))
    return full, norms


def test_activation_norm_figure_draws_each_layers_norm_per_step(tiny, traces):
    full, norms = traces
    fig = activation_norm_figure(full)
    (heat,) = fig.data
    assert list(heat.y) == [0, 1] and list(heat.x) == [0, 1, 2, 3, 4]
    for layer in (0, 1):
        want = full.activations[f"blocks.{layer}.hook_resid_post"].norm(dim=-1)
        assert list(heat.z[layer]) == pytest.approx(want.tolist(), rel=1e-6)
        # a record that reduced each step to its norm draws the same numbers, as they are
        assert list(activation_norm_figure(norms).data[0].z[layer]) == pytest.approx(want.tolist(), rel=1e-5)
    lines = activation_norm_figure({"a": full, "b": norms}, kind="lines")
    assert [t.name for t in lines.data] == ["layer 0", "layer 1"] * 2
    assert list(lines.data[3].y) == pytest.approx(torch.as_tensor(heat.z[1]).tolist(), rel=1e-5)
    assert [a.text for a in lines.layout.annotations] == ["a", "b"]
    both = activation_norm_figure({"a": full, "b": norms})
    assert both.data[0].zmax == both.data[1].zmax and [t.showscale for t in both.data] == [False, True]


def test_activation_norm_figure_refuses_a_trace_without_the_hook(tiny, traces):
    with pytest.raises(lp.LensprobeError, match="recorded no blocks.L.hook_resid_pre"):
        activation_norm_figure(traces[0], hook="hook_resid_pre")
    with pytest.raises(lp.LensprobeError, match="row 3 is out of range"):
        activation_norm_figure(traces[0], row=3)
    with pytest.raises(lp.LensprobeError, match="kind must be"):
        activation_norm_figure(traces[0], kind="bars")
