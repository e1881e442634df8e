"""Every figure fits at its default size: drawn by kaleido and measured in Chromium, no title, subtitle, panel
title, axis title, tick label or legend entry sticks out of the figure or lies over another; the same in the
report, in a real browser, at a wide and a narrow window; trace bands of non-negative quantities stay >= 0."""

import html
import inspect
import re

import plotly.graph_objects as go
import pytest
from figure_kinds import (
    every_figure,
    measure_page,
    measure_svgs,
    problems,
    render_svgs,
    screenshot,
    trace_summary,
)
from plotly.subplots import make_subplots

import lensprobe as lp
from lensprobe.viz.fit import MAX_WIDTH, fit_figure, text_px, wrap_text
from lensprobe.viz.report import Section, write_report
from lensprobe.viz.style import header, wrap_note

NOT_PLOTLY = {"Section", "results_section", "write_eval_report", "write_report", "save", "attention_view_html"}
LONG = ("top-20 recall >= 0.85 estimated (95% interval 0.62-0.97) from 40 random heads of the 260 outside the "
        "top 20, 1 of which beat the weakest found; 0-based indices (TransformerLens): L0H13 = the papers' layer 1")


def unfitted() -> dict:
    """Figures as plotly draws them without :func:`fit_figure`: the check must find what is wrong with them."""
    note = go.Figure(go.Scatter(x=[0, 1], y=[0, 1])).update_layout(
        width=680, height=480, title=dict(text=f"AtP estimate vs exact ablation<br><sup>{LONG}</sup>"))
    panels = make_subplots(rows=1, cols=2, horizontal_spacing=0.03, subplot_titles=(
        "(a) next-token entropy per step", "(b) attention proportion onto the thinking tokens per generation step"))
    for col in (1, 2):
        panels.add_trace(go.Scatter(x=[0, 1], y=[0.001, 0.5], name=f"condition {col}"), row=1, col=col)
    panels.update_layout(width=700, height=420, **header(f"Two panels<br><sup>{'<br>'.join(wrap_note(LONG, 590))}"
                                                          "</sup>", 420))
    return {"unfitted_note": note, "unfitted_panels": panels}


@pytest.fixture(scope="module")
def figures(tiny):
    return every_figure(tiny)


def test_every_figure_function_is_drawn(figures):
    public = {name for name in lp.viz.__all__ if name not in NOT_PLOTLY and inspect.isfunction(getattr(lp.viz, name))}
    assert len(public) >= 23 and public <= set(figures)
    assert all(isinstance(fig, go.Figure) and fig.layout.width and fig.layout.height for fig in figures.values())


@pytest.mark.slow  # starts the browser twice: kaleido draws every figure, Chromium measures them
def test_no_text_is_cut_or_drawn_over_other_text_at_the_default_size(figures, tmp_path):
    measured = measure_svgs(render_svgs({**figures, **unfitted()}, tmp_path), tmp_path)
    assert set(measured) == set(figures) | set(unfitted())
    # the check finds a cut subtitle, panel titles over each other and off the figure, a legend over a title
    note = problems(measured.pop("unfitted_note"))
    assert any("sticks out" in p and "of the 260" in p for p in note), note
    panels = problems(measured.pop("unfitted_panels"))
    assert any("annotation '(a)" in p and "overlaps annotation '(b)" in p for p in panels), panels
    assert any("annotation '(b)" in p and "sticks out" in p for p in panels), panels
    assert any(re.match(r"(title .* overlaps legend|legend .* overlaps title)", p) for p in panels), panels
    found = {kind: problems(m) for kind, m in measured.items()}
    assert {kind: p for kind, p in found.items() if p} == {}
    for kind, m in measured.items():
        fig = figures[kind]
        assert (m["width"], m["height"]) == (fig.layout.width, fig.layout.height), kind  # drawn at its own size
        titles = [t for t in m["texts"] if t["role"] == "title"]
        assert len(titles) == 1 and titles[0]["y0"] >= 0, kind
    # the two cases that were cut: the AtP subtitle's every word is drawn, the trace figure's right panel title too
    scatter = re.sub(r"[\s\u200b]+", " ", " ".join(t["text"] for t in measured["find_heads_scatter"]["texts"]
                                                    if t["role"] == "title"))
    written = html.unescape(re.sub(r"<[^>]+>", " ", figures["find_heads_scatter"].layout.title.text)).split()
    assert " ".join(written[-6:]) in scatter and "head 14" in scatter  # its last words too: nothing cut
    trace = [t for t in measured["generation_trace_figure"]["texts"] if t["role"] == "annotation"]
    assert any(t["text"].startswith("(b)") for t in trace)


def test_the_helper_widens_wraps_and_keeps_the_plot_area():
    assert text_px("WWW", 10) > text_px("iii", 10) > 0
    assert text_px("a<br>abc", 12) == text_px("abc", 12) and text_px("&gt;", 12) == text_px(">", 12)
    lines = wrap_text(LONG, 300, 12)
    assert len(lines) > 2 and all(text_px(x, 12) <= 300 for x in lines) and " ".join(lines) == LONG
    fig = fit_figure(unfitted()["unfitted_note"])
    head, note = fig.layout.title.text.split("<br><sup>")
    assert head == "AtP estimate vs exact ablation" and note.replace("<br>", " ").removesuffix("</sup>") == LONG
    assert all(text_px(x, 12) <= fig.layout.width - fig.layout.margin.l for x in note.split("<br>"))
    assert fig.layout.height - fig.layout.margin.t - fig.layout.margin.b >= 480 - 100 - 80  # the plot area kept
    wide = fit_figure(go.Figure().update_layout(title="x" * 400))
    assert wide.layout.width == MAX_WIDTH and wide.layout.title.text.count("<br>") == 0  # one word: not cut
    panels = fit_figure(unfitted()["unfitted_panels"])
    left, right = panels.layout.xaxis.domain, panels.layout.xaxis2.domain
    gap = (right[0] - left[1]) * (panels.layout.width - panels.layout.margin.l - panels.layout.margin.r)
    assert gap >= text_px("0.001", 12) + 22  # the right panel's tick labels and axis title fit between the panels


def test_trace_bands_of_non_negative_quantities_stay_non_negative():
    summary = trace_summary()
    assert (summary["lower"] < 0).any()  # mean - std below 0: the band must be clipped
    fig = lp.viz.generation_trace_figure(summary, band_label="mean ± std over 4 samples")
    bands = [t for t in fig.data if t.fill == "toself"]
    lines = [t for t in fig.data if t.fill != "toself"]
    assert bands and all(min(t.y) >= 0 for t in bands)
    assert all(max(t.y) <= 1 for t in bands if t.xaxis == "x2")  # a proportion: at most 1
    assert all("clipped" in t.name for t in bands) and all("clipped" in t.hovertemplate for t in lines)
    assert "clipped" in fig.layout.title.text
    first = summary[(summary["metric"] == "entropy")].iloc[0]
    assert list(lines[0].customdata[0]) == pytest.approx([first["lower"], first["upper"]])  # hover: the band's ends
    assert max(bands[0].y) == pytest.approx(summary[summary["metric"] == "entropy"]["upper"].max())


@pytest.mark.slow  # loads the report in Chromium three times
def test_the_report_shows_every_figure_whole(figures, tmp_path):
    shown = {k: figures[k] for k in ("find_heads_scatter", "generation_trace_figure", "sink_heatmap",
                                     "filler_vs_random_figure", "accuracy_by_level", "attention_received_figure")}
    index = write_report(tmp_path / "report", [Section("Figures", figures=list(shown.values()))])
    ids = {f"figures-figure-{i}": kind for i, kind in enumerate(shown, start=1)}
    for window in ((1280, 1000), (760, 1000)):  # a column wider and one narrower than the widest figure
        measured = measure_page(index, window)
        assert set(measured) == set(ids), window
        for div, m in measured.items():
            fig = figures[ids[div]]
            assert (m["width"], m["height"]) == (fig.layout.width, fig.layout.height), (window, ids[div])
            assert problems(m) == [], (window, ids[div])
    png = screenshot(index, tmp_path / "report.png", (1280, 2400))
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and int.from_bytes(png[16:20], "big") == 1280
    assert len(png) > 50_000  # the figures were drawn, not a blank page
