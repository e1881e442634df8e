"""Mechanism figures, drawn from hand-made tables: the traces, labels and the near-zero band."""

import pandas as pd
import pytest

import lensprobe as lp
from lensprobe.studies.mechanism import ActivationStats
from lensprobe.viz import activation_histogram_figure, affine_fit_figure
from lensprobe.viz.style import CONDITION_COLORS, INDEX_NOTE, PALETTE


def fit_table():
    rows = [(0, h, p, f"t{p}", 1 - 0.1 * h - 0.01 * p, 1e-3 * (h + 1)) for h in (3, 0) for p in range(3)]
    return pd.DataFrame(rows, columns=["layer", "head", "position", "token", "lambda", "rel_error"])


def test_affine_fit_figure_has_a_box_per_panel_with_paper_style_labels():
    fig = affine_fit_figure(fit_table(), title="fit")
    assert [t.type for t in fig.data] == ["box", "box"]
    lam, err = fig.data
    assert list(lam.x) == ["L0H3"] * 3 + ["L0H0"] * 3
    assert list(lam.y) == pytest.approx(fit_table()["lambda"].tolist())
    assert list(err.y) == pytest.approx(fit_table()["rel_error"].tolist())
    assert list(lam.customdata) == ["t0", "t1", "t2"] * 2
    assert fig.layout.xaxis.categoryarray == ("L0H3", "L0H0")  # first-seen order
    assert fig.layout.yaxis2.type == "log"
    assert "fit" in fig.layout.title.text and INDEX_NOTE in fig.layout.title.text
    assert any(s.y0 == 1.0 for s in fig.layout.shapes)  # lambda = 1 reference line
    assert affine_fit_figure(fit_table(), log_error=False).layout.yaxis2.type == "linear"


def stats_of():
    hist = pd.DataFrame({
        "condition": ["w/o"] * 4 + ["w/ Mless"] * 4 + ["w/o + ARM"] * 4,
        "center": [-0.3, -0.1, 0.1, 0.3] * 3,
        "fraction": [0.1, 0.4, 0.4, 0.1, 0.2, 0.3, 0.3, 0.2, 0.25, 0.25, 0.25, 0.25],
    })
    summary = pd.DataFrame({"condition": ["w/o", "w/ Mless", "w/o + ARM"], "near_zero": [0.25, 0.125, 0.0]})
    return ActivationStats(histogram=hist, summary=summary, layer=0, where="act_fn(gate)", segment="question",
                           eps=0.05, reference="w/o", magnitudes=(0.1,))


def test_activation_histogram_figure_overlays_conditions_and_shades_the_band():
    fig = activation_histogram_figure(stats_of())
    assert [t.name for t in fig.data] == ["w/o filler (near zero 25.0%)", "Mless (near zero 12.5%)",
                                          "w/o + ARM (near zero 0.0%)"]
    assert [t.line.color for t in fig.data] == [CONDITION_COLORS["w/o"], CONDITION_COLORS["w/ Mless"], PALETTE[0]]
    assert list(fig.data[1].y) == [0.2, 0.3, 0.3, 0.2] and list(fig.data[0].x) == [-0.3, -0.1, 0.1, 0.3]
    band = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(band) == 1 and (band[0].x0, band[0].x1) == (-0.05, 0.05)
    assert "layer 0" in fig.layout.title.text and fig.layout.xaxis.title.text == "activation act_fn(gate)"


def test_activation_histogram_figure_from_a_table_needs_eps():
    table = stats_of().histogram
    fig = activation_histogram_figure(table, eps=0.1, log_y=True)
    assert len(fig.data) == 3 and fig.layout.yaxis.type == "log"
    assert [t.name for t in fig.data][0] == "w/o filler"
    with pytest.raises(lp.LensprobeError, match="pass eps=... with a histogram table"):
        activation_histogram_figure(table)
    with pytest.raises(lp.LensprobeError, match=r"not an activation histogram table: columns \['fraction'\]"):
        activation_histogram_figure(table.drop(columns="fraction"), eps=0.1)
    with pytest.raises(lp.LensprobeError, match="not a filler_affine_fit table"):
        affine_fit_figure(fit_table().drop(columns="lambda"))


def test_histogram_opens_on_the_central_bins_and_the_band():
    centers = [-1.0, -0.1, 0.0, 0.1, 0.2, 5.0]
    share = [0.001, 0.2, 0.3, 0.3, 0.198, 0.001]  # the outer two bins hold 0.1% each
    table = pd.DataFrame({"condition": ["w/o"] * 6, "center": centers, "fraction": share})
    fig = activation_histogram_figure(table, eps=0.05, mass=0.99)
    assert list(fig.layout.xaxis.range) == [-0.1, 0.2]
    assert list(activation_histogram_figure(table, eps=0.05, mass=1.0).layout.xaxis.range) == [-1.0, 5.0]
    wide_band = activation_histogram_figure(table, eps=0.5, mass=0.99)
    assert list(wide_band.layout.xaxis.range) == [-1.0, 1.0]  # the band (2 eps each side) stays in view
