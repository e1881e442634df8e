"""Figures embedded at their own size: the report's frame of every figure is at least its layout height,
a figure with a width keeps it (a narrower column scrolls), one without fills the column, and plotly's toolbar
sits in a band above it."""

import re

import pandas as pd
import plotly.graph_objects as go

import lensprobe as lp
from lensprobe.viz.embed import SCROLLBAR_PX, TOOLBAR_PX, figure_div, figure_page, frame_height
from lensprobe.viz.report import Section, write_report


def figures(tiny):
    p = lp.build_prompt(tiny, "What is 2+3?", system=lp.MATH_SYSTEM_PROMPT)
    sweep = lp.ablation_sweep(tiny, [p], "entropy", progress=False)
    table = pd.DataFrame({"condition": ["w/o"], "model": "m", "accuracy": [0.5], "low": [0.2], "high": [0.8],
                          "n": 4, "correct": [2], "grader": "math-verify"})
    tall = go.Figure(go.Bar(x=[1], y=[1])).update_layout(height=1234)
    return [lp.viz.sweep_heatmap(sweep), lp.viz.accuracy_bars(table), tall, go.Figure()]


def test_every_report_figure_frame_is_at_least_its_layout_height(tiny, tmp_path):
    figs = figures(tiny)
    index = write_report(tmp_path / "rep", [Section("Figures", figures=figs)])
    page = index.read_text(encoding="utf-8")
    blocks = re.findall(r'<div class="lp-plot" data-height="(\d+)" style="([^"]*)">.*?<div style="height:(\d+)px',
                        page, re.S)
    assert len(blocks) == len(figs)
    for fig, (data_height, style, frame) in zip(figs, blocks, strict=True):
        own = fig.layout.height or 450
        assert int(data_height) == own and int(frame) >= own
        assert f"padding-top:{TOOLBAR_PX}px" in style  # the toolbar's band, above the figure's title
        assert ("max-width:" in style) == (fig.layout.width is not None)  # its own width, not wider ...
        assert ("min-width:" in style) == (fig.layout.width is not None)  # ... nor squeezed: the column scrolls
    assert ".lp-plot .modebar-container{top:-" in page


def test_the_embedded_copy_is_responsive_and_the_figure_is_left_as_it_was(tiny):
    heatmap = figures(tiny)[0]
    width = heatmap.layout.width
    div = figure_div(heatmap)
    assert f"max-width:{width}px;min-width:{width}px" in div and '"responsive": true' in div
    assert 'class="lp-frame" style="overflow-x:auto"' in div
    assert f'"width":{width}' not in div.replace(" ", "")  # the copy drops the fixed width
    assert heatmap.layout.width == width  # the caller's figure is unchanged
    assert frame_height(heatmap) == heatmap.layout.height + TOOLBAR_PX + SCROLLBAR_PX  # room for a scroll bar
    assert frame_height(go.Figure()) == 450 + TOOLBAR_PX  # fills the column: no scroll bar
    page = figure_page(heatmap)
    assert page.startswith("<!DOCTYPE html>") and 'src="plotly.min.js"' in page and "margin:0" in page
