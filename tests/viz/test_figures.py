"""Figures from hand-made results: the expected traces, panels, shaded spans and labels."""

import json
import re

import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from lensprobe.viz import (
    attention_received_figure,
    attention_view_html,
    condition_change_figure,
    filler_vs_random_figure,
    patch_figure,
    token_class_figure,
)

NONE_TOKENS = ["<s>", "sys", "Q", "?", "A"]
# with filler: <s> sys [/ / /] [\n] Q ? A  -> filler 2..4, filler_sep 5
MLESS_TOKENS = ["<s>", "sys", "/", " /", " /", "\n", "Q", "?", "A"]
MLESS_SEGMENTS = ["bos", "system", "filler", "filler", "filler", "filler_sep", "question", "question", "assistant"]
MLESS_ALIGNED = [0, 1, None, None, None, None, 2, 3, 4]


def received_table(pairs=((0, 1), (2, 0))):
    rows = []
    for layer, head in pairs:
        for pos, tok in enumerate(NONE_TOKENS):
            rows.append(("none", layer, head, f"L{layer}H{head}", pos, pos, tok, "x", 0.1 * pos + layer + head))
        for pos, tok in enumerate(MLESS_TOKENS):
            rows.append(("meaningless", layer, head, f"L{layer}H{head}", pos, MLESS_ALIGNED[pos], tok,
                         MLESS_SEGMENTS[pos], 0.01 * pos + layer))
    df = pd.DataFrame(rows, columns=["condition", "layer", "head", "head_label", "position", "aligned_pos",
                                     "token", "segment", "attention"])
    df["aligned_pos"] = df["aligned_pos"].astype("Int64")
    return df


@pytest.fixture(autouse=True)
def _no_show(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("viz functions must not call show()")

    monkeypatch.setattr(go.Figure, "show", boom)


def test_attention_received_figure_panels_traces_and_span():
    df = received_table()
    fig = attention_received_figure(df, [(0, 1), (2, 0)])
    assert isinstance(fig, go.Figure)
    # 2 rows x 2 columns: per row, two aligned traces (left) and the Mless series (right)
    assert len(fig.data) == 6
    left = [t for t in fig.data if t.xaxis == "x"]
    assert [t.name for t in left] == ["w/o filler", "Mless"]
    none_tr, mless_tr = left
    assert list(none_tr.x) == [0, 1, 2, 3, 4]
    assert list(none_tr.y) == pytest.approx([0.1 * p + 1 for p in range(5)])
    assert list(mless_tr.x) == [0, 1, 2, 3, 4]  # filler and its separator dropped
    assert list(mless_tr.y) == pytest.approx([0.0, 0.01, 0.06, 0.07, 0.08])
    assert list(mless_tr.customdata) == ["<s>", "sys", "Q", "?", "A"]
    right = [t for t in fig.data if t.xaxis == "x2"]
    assert len(right) == 1 and list(right[0].x) == list(range(9))
    # the filler span 2..4 is shaded on the right panel of each row
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(rects) == 2
    assert {(r.x0, r.x1) for r in rects} == {(1.5, 4.5)}
    assert {r.xref for r in rects} == {"x2", "x4"}
    # legend once, head labels on the rows, the 0-based note in the title
    assert [t.showlegend for t in fig.data].count(True) == 2
    assert "L0H1" in fig.layout.yaxis.title.text and "L2H0" in fig.layout.yaxis3.title.text
    assert "0-based" in fig.layout.title.text and "layer 1, head 14" in fig.layout.title.text


def test_attention_received_figure_defaults_and_no_filler():
    df = received_table(pairs=((1, 3),))
    fig = attention_received_figure(df)  # every pair in the table
    assert len(fig.data) == 3
    only_none = df[df["condition"] == "none"]
    fig = attention_received_figure(only_none)
    assert len(fig.data) == 1 and not fig.layout.shapes  # one panel, nothing to shade
    fig = attention_received_figure(df, conditions=["meaningless"], log_y=True)
    assert fig.layout.yaxis.type == "log"
    assert [t.name for t in fig.data if t.xaxis == "x"] == ["Mless"]


def test_filler_vs_random_one_panel_per_model():
    rows = []
    for model in ("modelA", "modelB"):
        for cond in ("meaningless", "random"):
            for pos in range(8):
                seg = "filler" if 3 <= pos < 6 else "question"
                rows.append((model, cond, 0, 4, "L0H4", pos, f"t{pos}", seg, pos / 10 + (cond == "random")))
    df = pd.DataFrame(rows, columns=["model", "condition", "layer", "head", "head_label", "position", "token",
                                     "segment", "attention"])
    fig = filler_vs_random_figure(df)
    assert len(fig.data) == 4
    assert {t.xaxis for t in fig.data} == {"x", "x2"}
    titles = [a.text for a in fig.layout.annotations]
    assert any("modelA" in t and "L0H4" in t for t in titles)
    assert any("modelB" in t for t in titles)
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert sorted(r.xref for r in rects) == ["x", "x2"]
    assert {(r.x0, r.x1) for r in rects} == {(2.5, 5.5)}
    rnd = [t for t in fig.data if t.name == "random sentence" and t.xaxis == "x2"][0]
    assert list(rnd.y) == pytest.approx([p / 10 + 1 for p in range(8)])
    fig = filler_vs_random_figure(df, cols=1)  # stacked vertically
    assert {t.yaxis for t in fig.data} == {"y", "y2"}


def test_token_class_figure_stacks_classes_side_by_side():
    rows = []
    for gi, group in enumerate(("w/o filler", "Mless")):
        for layer in (16, 0):
            for ci, cls in enumerate(("# (hash)", "* (star)", "whitespace", "other")):
                rows.append((group, layer, f"L{layer}", cls, 0.1 * ci + 0.01 * layer + gi / 100, 3 + ci))
    df = pd.DataFrame(rows, columns=["group", "layer", "layer_label", "token_class", "attention", "n_tokens"])
    fig = token_class_figure(df)
    assert fig.layout.barmode == "stack"
    assert [t.name for t in fig.data] == ["# (hash)", "* (star)", "whitespace", "other"]
    hash_tr = fig.data[0]
    assert [list(level) for level in hash_tr.x] == [["L0", "L0", "L16", "L16"],
                                                    ["w/o filler", "Mless", "w/o filler", "Mless"]]
    assert list(hash_tr.y) == pytest.approx([0.0, 0.01, 0.16, 0.17])
    assert list(fig.data[2].customdata) == [5, 5, 5, 5]


def test_condition_change_figure():
    df = pd.DataFrame({"condition": ["meaningless", "meaningless", "random", "random"],
                       "layer": [0, 0, 0, 0], "head": [0, 1, 0, 1], "head_label": ["L0H0", "L0H1"] * 2,
                       "change": [0.1, 0.2, 0.3, 0.4]})
    fig = condition_change_figure(df)
    assert [t.name for t in fig.data] == ["Mless", "random sentence"]
    assert list(fig.data[1].y) == [0.3, 0.4] and list(fig.data[1].x) == ["L0H0", "L0H1"]
    assert fig.layout.barmode == "group"


def test_attention_view_marks_span_and_is_offline():
    pattern = torch.softmax(torch.randn(2, 5, 5), -1).tril()
    tokens = ["<s>", "/", " /", "Q", "</end>"]
    out = attention_view_html(pattern, tokens, layer=3, span=(1, 3))
    tok_json = re.search(r'"tokens": (\[.*?\])', out).group(1)  # circuitsvis props, JSON
    assert json.loads(tok_json) == ["<s>", "«/»", "« /»", "Q", "<\u200b/end>"]
    assert "L3H0" in out and "L3H1" in out
    assert "positions 1-2" in out and "filler span" in out
    assert "CircuitsVis" in out
    assert not re.search(r"<script[^>]*\bsrc\s*=", out)
    assert "</end>" not in out  # a token cannot close the inline script
    out = attention_view_html(pattern, tokens, layer=0)
    assert "«" not in out.split("<div>")[0]  # no span, no marks
    plain = attention_view_html(pattern, tokens, layer=0, head_labels=["a", "b"])
    hostile = attention_view_html(pattern, tokens, layer=0, head_labels=["</script><b>x</b>", "b"])
    assert hostile.count("</script>") == plain.count("</script>")  # a head label cannot close it either
    names = json.loads(re.search(r'"attentionHeadNames": (\[.*?\])', hostile).group(1))
    assert names == ["<\u200b/script><b>x<\u200b/b>", "b"]


@pytest.mark.slow  # launches a Python process
def test_viz_and_report_are_attributes_imported_on_first_use():
    """``import lensprobe`` loads no plotting library; ``lp.viz`` imports on first use."""
    import subprocess
    import sys

    code = (
        "import sys, lensprobe as lp\n"
        "assert 'plotly' not in sys.modules and 'lensprobe.viz' not in sys.modules\n"
        "assert callable(lp.viz.generation_trace_figure) and callable(lp.viz.write_report)\n"
        "assert 'plotly' in sys.modules or 'lensprobe.viz' in sys.modules\n"
        "try:\n    lp.nonexistent\nexcept AttributeError as e:\n    print(e)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "no attribute 'nonexistent'" in res.stdout


def patch_table():
    rows = []
    for i, hook in enumerate(["blocks.0.hook_resid_post", "blocks.1.attn.hook_z"]):
        for j, seg in enumerate(["system", "question"]):
            change = 0.1 * i + 0.2 * j
            rows.append({"site": f"{hook} @ {seg}", "hook": hook, "segment": seg, "n_positions": 3 + j,
                         "clean": 1.0, "patched": 1.0 + change, "change": change, "source": 1.5,
                         "share": change / 0.5, "kl": 0.01 * (i + j)})
    rows.append({"site": "all sites", "hook": "all", "segment": "all", "n_positions": 14, "clean": 1.0,
                 "patched": 1.45, "change": 0.45, "source": 1.5, "share": 0.9, "kl": 0.2})
    return pd.DataFrame(rows)


def test_patch_figure_cells_and_combined_row():
    fig = patch_figure(patch_table())
    (heat,) = fig.data
    assert list(heat.y) == ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z"]
    assert list(heat.x) == ["system", "question"]
    assert [v for r in heat.z for v in r] == pytest.approx([0.0, 0.4, 0.2, 0.6])
    assert heat.text[1][1] == "0.600" and heat.zmid == 0
    assert "all sites at once: share 0.900" in fig.layout.title.text
    assert "clean 1.0000 → patched 1.3000" in heat.customdata[1][1]
    kl = patch_figure(patch_table(), value="kl").data[0]
    assert [v for r in kl.z for v in r] == pytest.approx([0.0, 0.01, 0.01, 0.02]) and kl.zmid is None
    with pytest.raises(ValueError, match="value must be"):
        patch_figure(patch_table(), value="patched")
