"""The logit-lens heatmap of a real (tiny) trace: its cells are the trace's values, layer x step for the steps the
row ran; its hover data names each cell's top token, probabilities and ranks; bad input is refused."""

import html
import math

import plotly.graph_objects as go
import pytest
import torch

import lensprobe as lp
from lensprobe.viz.style import LENS_COLORS


@pytest.fixture(scope="module")
def trace(tiny):
    return lp.generate(tiny, [[5, 17, 3, 99, 42], [11, 12, 13]], max_new_tokens=6, stop_at_eos=False, caps=[4, 6],
                       lens="logit", lens_top_k=3)


def shown(token: str) -> str:
    return html.escape(repr(token)[1:-1]) or "(empty)"


@pytest.fixture(autouse=True)
def _no_show(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("viz functions must not call show()")

    monkeypatch.setattr(go.Figure, "show", boom)


def test_the_cells_are_the_trace_values_layer_by_step(trace):
    lens = trace.lens
    for row, n in ((0, 4), (1, 6)):
        fig = lp.viz.logit_lens(trace, row=row)
        (heat,) = fig.data
        assert list(heat.x) == list(range(n)) and list(heat.y) == lens.layers
        assert torch.allclose(torch.tensor(heat.z), lens.entropy_rows[row, :n].T)
        assert heat.colorscale == go.Heatmap(colorscale=LENS_COLORS["entropy"]).colorscale
        for i in range(len(lens.layers)):
            for t in range(n):
                top, top_p, chosen, rank, p, ent, kl = heat.customdata[i][t]
                assert top == shown(lens.token_text[int(lens.top_ids_rows[row, t, i, 0])])
                assert math.isclose(top_p, float(lens.top_probs_rows[row, t, i, 0]), rel_tol=1e-6)
                assert chosen == shown(trace.str_tokens_rows[row][t])
                assert rank == int(lens.chosen_rank_rows[row, t, i]) and math.isclose(p, float(lens.chosen_prob_rows[row, t, i]), rel_tol=1e-6)
                assert math.isclose(ent, float(lens.entropy_rows[row, t, i]), rel_tol=1e-6)
                assert math.isclose(kl, float(lens.kl_rows[row, t, i]), rel_tol=1e-6, abs_tol=1e-12)
        assert list(heat.text[0]) == [heat.customdata[0][t][0] for t in range(n)]  # few cells: the top token in each


def test_rank_and_kl_colours(trace):
    lens = trace.lens
    fig = lp.viz.logit_lens(trace, row=1, color="rank")
    ranks = lens.chosen_rank_rows[1].T
    assert torch.allclose(torch.tensor(fig.data[0].z, dtype=torch.float64), torch.log10(1 + ranks.double()))
    assert int(fig.data[0].colorbar.ticktext[-1]) == int(ranks.max())
    fig = lp.viz.logit_lens(trace, row=1, color="kl")
    assert torch.allclose(torch.tensor(fig.data[0].z), lens.kl_rows[1].T)


def test_the_figure_fits_its_default_size(trace):
    fig = lp.viz.logit_lens(trace, row=1)
    width, height, margin = fig.layout.width, fig.layout.height, fig.layout.margin
    assert width >= 480 and height >= 360
    plot_w, plot_h = width - margin.l - margin.r - 100, height - margin.t - margin.b  # 100: the colour bar
    assert plot_w / 6 >= 14 and plot_h / 2 >= 18  # every cell is big enough to hover
    assert len(fig.layout.title.text.split("<br>")[0]) * 8 + 110 <= width


def test_bad_input_is_refused(tiny, trace):
    plain = lp.generate(tiny, [1, 2, 3], max_new_tokens=2)
    with pytest.raises(lp.LensprobeError, match="no logit lens"):
        lp.viz.logit_lens(plain)
    with pytest.raises(lp.LensprobeError, match=r"row must be a row of the trace \(0-1\)"):
        lp.viz.logit_lens(trace, row=2)
    with pytest.raises(lp.LensprobeError, match="color must be one of"):
        lp.viz.logit_lens(trace, color="prob")
