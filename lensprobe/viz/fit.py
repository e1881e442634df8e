"""Figures sized from their content: width, height, margins and panel gaps computed from the text they hold.

plotly places a title, the panel titles and a legend above the plot at fixed positions and never wraps text,
so a long subtitle, a panel title wider than its panel or a second legend row is cut or drawn over something
else. :func:`lensprobe.viz.fit.fit_figure`, called by every figure function of :mod:`lensprobe.viz` on the
figure it built, measures that text (:func:`lensprobe.viz.fit.text_px`, with the advance widths of DejaVu Sans,
as wide as Verdana and wider than Open Sans and Arial, so the estimate errs on the roomy side) and then

- widens the figure (up to :data:`lensprobe.viz.fit.MAX_WIDTH`) until its title, panel titles and axis titles
  fit, and wraps what still does not (the title's note always wraps to the width);
- makes the top margin hold the title's lines, a legend above the plot (however many rows it wraps to) and the
  first row's panel titles;
- spaces panels apart by what sits between them (tick labels, axis titles, panel titles);
- keeps the plot area the figure function asked for (its height minus its margins) and adds the rest around it.

``tests/viz/test_figures_fit.py`` draws every figure kind with kaleido and measures its text in Chromium.

Example:
    >>> fig = fit_figure(go.Figure(go.Scatter(x=[0, 1], y=[0, 1])).update_layout(
    ...     title=dict(text="Head<br><sup>a long note that wraps to the figure's width</sup>")))
"""

import html
import re
from typing import Any

__all__ = ["MAX_WIDTH", "fit_figure", "text_px", "wrap_text"]

MAX_WIDTH = 1100
"""A figure grows to this width for its text; wider text is wrapped (the report's column is 1136 px)."""
MIN_WIDTH = 480
"""No figure is narrower."""
TITLE_TOP = 24
"""Where plotly is told the title starts (its first line then starts about 10 px from the top)."""
"""No figure is narrower."""
TITLE_PX, NOTE_PX, PANEL_PX, AXIS_PX, TICK_PX, LEGEND_PX = 17.0, 12.0, 16.0, 14.0, 12.0, 12.0
"""Font sizes plotly draws a title, its ``<sup>`` note, panel titles, axis titles, tick labels and legend text at."""

# Advance widths of DejaVu Sans (em / 100) for the characters 32-126.
_EM = [int(w) for w in (
    "32,40,46,84,64,95,78,27,39,39,50,84,32,36,32,34,64,64,64,64,64,64,64,64,64,64,34,34,84,84,84,53,100,68,69,70,77,"
    "63,58,77,75,29,29,66,56,86,75,79,60,79,69,63,61,73,68,99,69,61,69,39,34,39,84,50,50,61,63,55,63,62,35,63,63,28,28,"
    "58,28,97,63,61,63,63,41,52,39,63,59,82,59,59,52,64,34,64,84").split(",")]
_TAG = re.compile(r"<[^>]*>")


def plain(text: str) -> str:
    """``text`` as plotly shows it on one line: tags dropped, entities read."""
    return html.unescape(_TAG.sub("", text))


def text_px(text: str, size: float) -> float:
    """Pixels the widest line of ``text`` (plotly's HTML subset: ``<br>`` breaks lines, other tags are dropped)
    takes at font ``size``."""
    def line(s: str) -> float:
        return sum(_EM[ord(c) - 32] if 32 <= ord(c) < 127 else (100 if ord(c) >= 0x2E80 else 68)
                   for c in plain(s)) * size / 100

    return max((line(s) for s in re.split(r"<br\s*/?>", text, flags=re.I)), default=0.0)


def wrap_text(text: str, width_px: float, size: float) -> list[str]:
    """``text`` cut at spaces (never inside a tag) into lines of at most ``width_px`` at font ``size`` (a single
    word wider than that stays whole); tags and entities are kept as they are."""
    lines: list[str] = []
    for word in re.split(r" (?![^<]*>)", text):
        if lines and text_px(lines[-1] + " " + word, size) <= width_px:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return [line for line in lines if line] or [""]


def _one_line(text: str) -> str:
    """``text`` with its line breaks made spaces; tags and entities kept as they are (escaped text stays escaped)."""
    return re.sub(r"\s*<br\s*/?>\s*", " ", text, flags=re.I).strip()


def _title_parts(fig) -> tuple[str, str]:
    """The title's head and its ``<sup>`` note (each on one line again, earlier wrapping undone)."""
    text = fig.layout.title.text or ""
    head, _, rest = text.partition("<sup>")
    note = rest.rsplit("</sup>", 1)[0]
    return _one_line(head), _one_line(note)


def _axes(fig, letter: str) -> list[tuple[str, Any]]:
    """``[(name, axis)]`` of the layout's x or y axes that carry data (``xaxis``, ``xaxis2``, ...)."""
    names = sorted((k for k in fig.layout.to_plotly_json() if re.fullmatch(rf"{letter}axis\d*", k)),
                   key=lambda k: int(k[5:] or 1))
    return [(n, fig.layout[n]) for n in names] or [(f"{letter}axis", fig.layout[f"{letter}axis"])]


def _ref(name: str) -> str:
    """``"xaxis2"`` -> ``"x2"``."""
    return name[0] + name[5:]


def _tick_px(fig, name: str, letter: str) -> float:
    """How far the tick labels of an axis reach out from it (width for a y axis, height for an x axis)."""
    axis = fig.layout[name]
    if axis.showticklabels is False:
        return 0.0
    ref = _ref(name)
    labels = [str(t) for t in axis.ticktext or ()]
    for trace in fig.data:
        if (getattr(trace, f"{letter}axis", None) or letter) == ref:
            values = getattr(trace, letter, None)
            labels += [v for v in (values if values is not None else ()) if isinstance(v, str)]
    if letter == "x":
        rotated = labels and axis.tickangle not in (None, 0)
        return (max(text_px(v, TICK_PX) for v in labels) * 0.75 if rotated else TICK_PX) + 8
    return (max(text_px(v, TICK_PX) for v in labels) if labels else text_px("-0.0005", TICK_PX)) + 8


def _columns(axes: list) -> list[tuple[float, float]]:
    """The distinct domains of ``axes``, in order."""
    return sorted({tuple(a.domain or (0, 1)) for _, a in axes})


def _panel_titles(fig) -> list:
    """The panel titles plotly's ``make_subplots`` put above each panel."""
    return [a for a in fig.layout.annotations if a.xref == "paper" and a.yref == "paper" and a.yanchor == "bottom"
            and a.xanchor == "center" and a.text]


def _space(domains: list[tuple[float, float]], gaps_px: list[float], length_px: float) -> list[tuple[float, float]]:
    """Equal panels along ``length_px`` pixels with ``gaps_px[i]`` pixels before panel ``i + 1``."""
    n = len(domains)
    free = max(length_px - sum(gaps_px), 40.0 * n)
    size = free / n / length_px
    out, at = [], 0.0
    for i in range(n):
        out.append((round(at, 6), round(min(1.0, at + size), 6)))
        at += size + (gaps_px[i] / length_px if i < len(gaps_px) else 0)
    return out


def _legend_rows(fig, width: float) -> int:
    """Rows a horizontal legend wraps to in ``width`` pixels."""
    names = [t.name for t in fig.data if t.name and t.showlegend is not False
             and (t.showlegend or t.type not in ("heatmap",))]
    names = list(dict.fromkeys(names))
    rows, used = 1, text_px(fig.layout.legend.title.text or "", LEGEND_PX)
    for name in names:
        w = text_px(name, LEGEND_PX) + 46
        if used and used + w > width:
            rows, used = rows + 1, 0.0
        used += w
    return rows


def _column_gaps(fig, xaxes: list, columns: list) -> list[float]:
    """Pixels between panels side by side: the next panel's tick labels and y axis title, and some air."""
    gaps = []
    for dom in columns[1:]:
        left = max((_tick_px(fig, "y" + n[1:], "y") + (22 if fig.layout["y" + n[1:]].title.text else 0)
                    for n, a in xaxes if tuple(a.domain or (0, 1)) == dom and "y" + n[1:] in fig.layout),
                   default=0.0)
        gaps.append(left + 28)
    return gaps


def _place_columns(xaxes: list, panels: list, columns: list, gaps: list[float], plot_w: float) -> None:
    """Panels side by side spaced by ``gaps``; panel titles centred over them again, and panel and x axis titles
    wider than their panel wrapped."""
    if len(columns) > 1:
        spaced = dict(zip(columns, _space(columns, gaps, plot_w), strict=True))
        for _n, a in xaxes:
            a.domain = spaced[tuple(a.domain or (0, 1))]
        for ann in panels:
            old = min(columns, key=lambda d: abs((d[0] + d[1]) / 2 - ann.x))
            ann.x = sum(spaced[old]) / 2
    col_px = (plot_w - sum(gaps)) / len(columns)
    for ann in panels:
        if text_px(ann.text, PANEL_PX) + 8 > col_px:
            ann.text = "<br>".join(wrap_text(_one_line(ann.text), col_px - 8, PANEL_PX))
    for _n, a in xaxes:
        if a.title.text and text_px(a.title.text, AXIS_PX) + 8 > col_px:
            a.title.text = "<br>".join(wrap_text(_one_line(a.title.text), col_px - 8, AXIS_PX))


def _panel_rows_px(panels: list, top: float) -> float:
    """Height of the panel titles of the row whose top is at ``top`` (paper coordinates)."""
    return max((21 * (a.text.count("<br>") + 1) for a in panels if abs(a.y - top) < 1e-6), default=0)


def _place_rows(fig, xaxes: list, yaxes: list, panels: list, rows: list, plot_h: float) -> float:
    """Panels one above another, each gap holding the panel titles under it and the x tick labels and title over
    it; returns the plot area's height (grown when the gaps need it)."""
    if len(rows) < 2:
        return plot_h
    ordered = sorted(rows, key=lambda d: -d[1])  # top row first
    gaps = []
    for upper, lower in zip(ordered, ordered[1:], strict=False):
        ticks = max((_tick_px(fig, n, "x") + (22 if a.title.text else 0) for n, a in xaxes
                     if "y" + n[1:] in fig.layout and tuple(fig.layout["y" + n[1:]].domain or (0, 1)) == upper),
                    default=0.0)
        gaps.append(ticks + _panel_rows_px(panels, lower[1]) + 12)
    plot_h = max(plot_h, sum(gaps) + 120 * len(rows))
    new = {d: (round(1 - s[1], 6), round(1 - s[0], 6)) for d, s in zip(ordered, _space(ordered, gaps, plot_h),
                                                                        strict=True)}
    for _, a in yaxes:
        a.domain = new[tuple(a.domain or (0, 1))]
    for ann in panels:
        ann.y = new[min(rows, key=lambda d: abs(d[1] - ann.y))][1]
    return plot_h


def _wrap_y_titles(yaxes: list, plot_h: float) -> None:
    """y axis titles wrapped to their axis' length."""
    for _n, a in yaxes:
        if a.title.text:
            length = plot_h * ((a.domain or (0, 1))[1] - (a.domain or (0, 1))[0])
            if text_px(a.title.text, AXIS_PX) + 8 > length:
                a.title.text = "<br>".join(wrap_text(_one_line(a.title.text), length - 8, AXIS_PX))


def fit_figure(fig, *, width: float | None = None, plot_height: float | None = None, legend_above: bool | None = None):
    """Size ``fig`` to its content (see the module); returns ``fig``, changed in place.

    Args:
        fig: a plotly figure built by a figure function (its ``height`` and ``margin`` give the plot area it wants,
            its ``width``, if any, the least width).
        width: the least width (default: the figure's own, else 700).
        plot_height: the plot area's height (default: the figure's height minus its top and bottom margins).
        legend_above: whether the legend sits above the plot, under the title (default: when the figure's
            legend is horizontal).
    """
    lay = fig.layout
    margin_b = lay.margin.b if lay.margin.b is not None else 80
    ml = lay.margin.l if lay.margin.l is not None else 80
    has_scale = any(getattr(t, "showscale", None) is not False and t.type == "heatmap" for t in fig.data)
    mr = max(lay.margin.r if lay.margin.r is not None else 30, 110 if has_scale else 0)
    plot_h = plot_height if plot_height is not None else (
        (lay.height or 450) - (lay.margin.t if lay.margin.t is not None else 100) - margin_b)
    above = legend_above if legend_above is not None else lay.legend.orientation == "h"
    head, note = _title_parts(fig)
    xaxes, yaxes = _axes(fig, "x"), _axes(fig, "y")
    columns, rows = _columns(xaxes), _columns(yaxes)
    panels = _panel_titles(fig)

    # the width: the least one, then what the text needs, up to MAX_WIDTH
    gaps = _column_gaps(fig, xaxes, columns)
    widest = max([text_px(a.text, PANEL_PX) for a in panels] + [text_px(a.title.text or "", AXIS_PX) for _, a in xaxes])
    need = max(text_px(head, TITLE_PX) + ml + 20, ml + mr + sum(gaps) + len(columns) * (widest + 16))
    w = max(MIN_WIDTH, width or lay.width or 700, min(MAX_WIDTH, need))
    _place_columns(xaxes, panels, columns, gaps, w - ml - mr)

    # the top margin: the title's lines (head and note wrapped to the width), the legend, the first panel titles
    head_lines = wrap_text(head, w - ml - 16, TITLE_PX) if head else []
    note_lines = wrap_text(note, w - ml - 16, NOTE_PX) if note else []
    title_px = 12 + 23 * len(head_lines) + 22 * len(note_lines)
    legend_px = 20 * _legend_rows(fig, w - ml - 10) + 6 if above else 0
    top = title_px + legend_px + _panel_rows_px(panels, max((d[1] for d in rows), default=1)) + 14
    plot_h = max(plot_h, (lay.height or 450) - top - margin_b)  # never shorter than the figure asked for
    plot_h = _place_rows(fig, xaxes, yaxes, panels, rows, plot_h)
    _wrap_y_titles(yaxes, plot_h)

    h = round(plot_h + top + margin_b)
    text = "<br>".join(head_lines) + (f"<br><sup>{'<br>'.join(note_lines)}</sup>" if note_lines else "")
    fig.update_layout(width=round(w), height=h, margin=dict(t=top, b=margin_b, l=ml, r=mr),
                      title=dict(text=text, x=0, xref="paper", y=1 - TITLE_TOP / h, yref="container",
                                 yanchor="top"))
    if above:
        fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", xref="paper", yref="container",
                                      y=1 - (title_px + 4) / h, yanchor="top"))
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    return fig
