"""Attribution figures from hand-made results: the heatmap's cells and the scatter's points and diagonal."""

import pandas as pd
import torch

from lensprobe.experiments.attribution import Attribution
from lensprobe.experiments.verify import Verification
from lensprobe.viz import attribution_heatmap, attribution_scatter


def made_attribution(unit="head"):
    units = [(0, (0,)), (0, (1,)), (1, (1,))] if unit == "head" else [(0, (0, 1)), (1, (2, 3))]
    est = torch.tensor([[0.5, -1.0, 2.0], [1.5, -3.0, 0.0]])[:, :len(units)]
    return Attribution(units, est, est.abs(), torch.zeros(2), "atp*", "entropy", unit, 2, 4, 2)


def test_heatmap_cells_are_mean_estimates_and_blank_elsewhere():
    fig = attribution_heatmap(made_attribution())
    z = fig.data[0].z
    assert z[0][0] == 1.0 and z[0][1] == -2.0 and z[1][1] == 1.0
    assert z[1][0] != z[1][0]  # not estimated: NaN, drawn blank
    assert fig.data[0].zmax == 2.0 and fig.data[0].zmin == -2.0
    assert fig.data[0].text[0][1] == "L0H1" and "AtP*" in fig.layout.title.text
    groups = attribution_heatmap(made_attribution("kv"))
    assert len(groups.data[0].z[0]) == 2 and groups.data[0].text[1][1] == "L1KV1"
    assert groups.layout.xaxis.title.text.startswith("KV group")


def test_scatter_points_by_choice_and_diagonal():
    table = pd.DataFrame({"head_label": ["L0H1", "L1H1", "L0H0"], "estimate": [-2.0, 1.0, 0.1],
                          "exact": [-1.5, 1.2, 0.9], "chosen": ["top", "top", "sample"]})
    ver = Verification(table, 2, 1.0, 0.5, 0.5, table.iloc[2:], "atp*", "entropy")
    fig = attribution_scatter(ver)
    top, sample, line = fig.data
    assert list(top.x) == [-1.5, 1.2] and list(top.y) == [-2.0, 1.0] and list(top.text) == ["L0H1", "L1H1"]
    assert list(sample.text) == ["L0H0"]
    assert list(line.x) == [-2.0, 1.2] and list(line.y) == [-2.0, 1.2]
    assert "top-2 recall 0.50 (exact: every head verified)" in fig.layout.title.text
    unknown = Verification(table.iloc[:2], 2, 1.0, 1.0, float("nan"), table.iloc[:0], "atp*", "entropy",
                           recall_kind="unknown", outside=1)
    assert "recall not measured" in attribution_scatter(unknown).layout.title.text


def test_a_nan_estimate_is_told_from_a_unit_not_estimated():
    units = [(0, (0,)), (0, (1,))]
    est = torch.tensor([[float("nan"), 1.0]])
    att = Attribution(units, est, est.abs(), torch.zeros(1), "atp", "entropy", "head", 2, 2)
    grid, measured = att.grid(), att.measured()
    assert grid[0, 0] != grid[0, 0] and grid[1, 0] != grid[1, 0]  # both NaN in the grid ...
    assert measured.tolist() == [[True, True], [False, False]]  # ... but only one was estimated
    text = attribution_heatmap(att).data[0].text
    assert text[0][0] == "L0H0 (NaN)" and text[0][1] == "L0H1" and text[1][0] == "L1H0 (not estimated)"
