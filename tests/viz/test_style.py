"""One style: condition labels and colours in one place, whatever spelling a table uses."""

import pandas as pd

from lensprobe.viz import accuracy_bars, attention_received_figure, head_attention_figure
from lensprobe.viz.style import (
    CONDITION_COLORS,
    PALETTE,
    condition_colors,
    condition_label,
    same_condition,
    table_spelling,
)


def test_labels_and_colours_accept_every_spelling():
    for name, old in (("w/o", "none"), ("w/ Mless", "meaningless"), ("w/ Mful", "meaningful"),
                      ("random sentence", "random")):
        assert condition_label(name) == condition_label(old)
        assert condition_colors([old])[old] == CONDITION_COLORS[name]
        assert same_condition(name, old)
    assert [condition_label(c) for c in ("w/o", "w/ Mless", "w/ Mful")] == ["w/o filler", "Mless", "Mful"]
    assert condition_label("mine") == "mine"
    assert table_spelling("meaningless", ["none", "meaningless"]) == "meaningless"
    assert table_spelling("meaningless", ["w/o", "w/ Mless"]) == "w/ Mless"


def test_other_conditions_take_the_palette_in_order():
    colors = condition_colors(["w/o", "a", "w/ Mless", "b", "a"])
    assert colors == {"w/o": CONDITION_COLORS["w/o"], "a": PALETTE[0], "w/ Mless": CONDITION_COLORS["w/ Mless"],
                      "b": PALETTE[1]}


def _received(conditions):
    rows = []
    for c in conditions:
        for pos in range(4):
            seg = "filler" if (c != conditions[0] and pos == 1) else "question"
            aligned = None if seg == "filler" else pos - (pos > 1 and c != conditions[0])
            rows.append((c, 0, 2, "L0H2", pos, aligned, f"t{pos}", seg, 0.1 * pos))
    df = pd.DataFrame(rows, columns=["condition", "layer", "head", "head_label", "position", "aligned_pos",
                                     "token", "segment", "attention"])
    df["aligned_pos"] = df["aligned_pos"].astype("Int64")
    return df


def test_figures_label_and_colour_old_and_new_tables_alike():
    for names in (["w/o", "w/ Mless"], ["none", "meaningless"]):
        df = _received(names)
        fig = attention_received_figure(df, conditions=["none", "w/ Mless"], shade_condition="meaningless")
        left = [t for t in fig.data if t.xaxis == "x"]
        assert [t.name for t in left] == ["w/o filler", "Mless"]
        assert [t.line.color for t in left] == [CONDITION_COLORS["w/o"], CONDITION_COLORS["w/ Mless"]]
        assert [t.name for t in fig.data if t.xaxis == "x2"] == ["Mless"]
        fig = head_attention_figure(df, 0, 2, conditions=["meaningless"])
        assert [t.name for t in fig.data] == ["Mless"]


def test_accuracy_bars_colour_built_in_and_other_conditions():
    table = pd.DataFrame({"model": ["m"] * 3, "condition": ["w/o", "w/ Mless", "w/o [ablate L0H3]"],
                          "accuracy": [0.5, 0.6, 0.4], "low": [0.3, 0.4, 0.2], "high": [0.7, 0.8, 0.6],
                          "correct": [5, 6, 4], "n": [10, 10, 10]})
    fig = accuracy_bars(table)
    assert [t.name for t in fig.data] == ["w/o", "w/ Mless", "w/o [ablate L0H3]"]
    assert [t.marker.color for t in fig.data] == [CONDITION_COLORS["w/o"], CONDITION_COLORS["w/ Mless"], PALETTE[0]]
