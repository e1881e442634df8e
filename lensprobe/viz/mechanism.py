"""Figures of the layer-0 mechanism (:mod:`lensprobe.studies.mechanism`): the affine rescaling of
attention by the filler, and the MLP activations moving away from zero.

Both functions draw the study's tables as they are (nothing is computed here, nothing is shown).
Heads are labelled 0-based, TransformerLens-style ("L0H13" is the papers' "layer 1, head 14").
"""

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.heads import head_label
from lensprobe.viz.fit import fit_figure
from lensprobe.viz.style import (
    INDEX_NOTE,
    NEAR_ZERO_COLOR,
    TRACE_COLORS,
    condition_colors,
    condition_label,
    header,
    unique,
)

__all__ = ["activation_histogram_figure", "affine_fit_figure"]

FIT_COLUMNS = ("layer", "head", "lambda", "rel_error")
HIST_COLUMNS = ("condition", "center", "fraction")


def _require(table: Any, columns: tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in getattr(table, "columns", ())]
    if missing:
        raise LensprobeError(f"not {what}: columns {missing} are missing.")


def affine_fit_figure(fit, *, title: str | None = None, log_error: bool = True):
    """``lambda`` and the fit's relative error per head, one point per query position.

    Top panel: ``lambda = 1 - attention mass on the filler`` (1 = the filler takes nothing, a
    dashed line). Bottom panel: ``rel_error`` of ``out_with = lambda * out_without + bias``
    (0 = exact). Each head is a box with its points.

    Args:
        fit: the table of :func:`lensprobe.studies.mechanism.filler_affine_fit` (columns
            ``layer``, ``head``, ``lambda``, ``rel_error``; ``token`` is shown on hover when present).
        title: figure title.
        log_error: logarithmic axis for the error (exact fits are around 1e-7).

    Returns:
        A plotly ``Figure`` with two box traces (``lambda``, ``rel_error``).

    Example:
        >>> fig = affine_fit_figure(filler_affine_fit(model, with_f, without))
    """
    _require(fit, FIT_COLUMNS, "a filler_affine_fit table")
    labels = [head_label(int(a), int(b)) for a, b in zip(fit["layer"], fit["head"], strict=True)]
    order = unique(labels)
    tokens = fit["token"].astype(str).tolist() if "token" in fit.columns else [""] * len(fit)
    height = 620
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=["lambda = 1 - attention on the filler",
                                        "relative error of lambda * out_without + bias"])
    for row, (column, name) in enumerate((("lambda", "lambda"), ("rel_error", "rel_error")), start=1):
        fig.add_trace(go.Box(
            x=labels, y=fit[column].tolist(), name=name, boxpoints="all", jitter=0.4, pointpos=0,
            marker=dict(color=TRACE_COLORS[row - 1], size=5), line=dict(color=TRACE_COLORS[row - 1]),
            customdata=tokens, hovertemplate="%{x}<br>token %{customdata}<br>" + name + " %{y:.3g}<extra></extra>"),
            row=row, col=1)
    fig.add_hline(y=1.0, line_dash="dash", line_color="#999999", row=1, col=1)
    fig.update_yaxes(title_text="lambda", row=1, col=1)
    fig.update_yaxes(title_text="relative error", type="log" if log_error else "linear", row=2, col=1)
    fig.update_xaxes(categoryorder="array", categoryarray=order)
    fig.update_xaxes(title_text="head (0-based)", row=2, col=1)
    head = title or "Filler tokens rescale attention: out_with = lambda * out_without + bias"
    fig.update_layout(**header(f"{head}<br><sup>{INDEX_NOTE}; one point per question position</sup>", height),
                      height=height, template="plotly_white", showlegend=False,
                      margin=dict(t=110, l=80, r=30, b=60))
    return fit_figure(fig)


def activation_histogram_figure(stats, *, eps: float | None = None, title: str | None = None,
                                log_y: bool = False, mass: float = 0.995):
    """MLP activation histograms overlaid per condition, the near-zero band shaded.

    The share of entries per bin (bins shared by every condition), one step line per condition;
    the band ``|a| < eps`` is shaded, so activations leaving it for both sides show as lower
    mass inside the band and more in the tails.

    Args:
        stats: an :class:`~lensprobe.studies.mechanism.ActivationStats`, or its ``histogram``
            table (columns ``condition``, ``center``, ``fraction``) with ``eps`` given.
        eps: half-width of the band (default: ``stats.eps``).
        title: figure title.
        log_y: logarithmic y axis.
        mass: the x axis first shows the central bins holding this share of every condition's
            entries (and the band); the long tails stay reachable by zooming out. ``1``: all bins.

    Returns:
        A plotly ``Figure``: one line per condition, the band as a shape.

    Example:
        >>> fig = activation_histogram_figure(activation_stats(model, {"w/o": p0, "w/ Mless": p1}))
    """
    table = getattr(stats, "histogram", stats)
    _require(table, HIST_COLUMNS, "an activation histogram table")
    eps = getattr(stats, "eps", None) if eps is None else eps
    if eps is None:
        raise LensprobeError("pass eps=... with a histogram table (an ActivationStats carries its own).")
    summary = getattr(stats, "summary", None)
    near = ({str(c): float(v) for c, v in zip(summary["condition"], summary["near_zero"], strict=True)}
            if summary is not None and "near_zero" in summary.columns else {})
    conditions = [str(c) for c in unique(table["condition"])]
    colors = condition_colors(conditions)
    height = 480
    fig = go.Figure()
    fig.add_vrect(x0=-eps, x1=eps, fillcolor=NEAR_ZERO_COLOR, opacity=0.2, line_width=0, layer="below",
                  annotation_text=f"|a| &lt; eps = {eps:.3g}", annotation_position="top left",
                  annotation_font_size=10)
    for c in conditions:
        rows = table[table["condition"].astype(str) == c]
        name = condition_label(c) + (f" (near zero {near[c]:.1%})" if c in near else "")
        fig.add_trace(go.Scatter(
            x=rows["center"].tolist(), y=rows["fraction"].tolist(), mode="lines", line_shape="hvh", name=name,
            line=dict(color=colors[c], width=1.6),
            hovertemplate="a = %{x:.3g}<br>share %{y:.4f}<extra>%{fullData.name}</extra>"))
    where = getattr(stats, "where", "act_fn(gate)")
    layer = getattr(stats, "layer", None)
    at = f" at layer {layer}" if layer is not None else ""
    head = title or f"MLP activations {where}{at} per condition: do they move away from zero?"
    fig.update_layout(
        **header(f"{head}<br><sup>{INDEX_NOTE}; question positions only; shaded: near-zero band</sup>",
                 height, "condition: "),
        height=height, template="plotly_white", margin=dict(t=120, l=80, r=30, b=60),
        xaxis_title=f"activation {where}", yaxis_title="share of entries per bin",
        yaxis_type="log" if log_y else "linear", xaxis_range=_central_range(table, conditions, mass, eps))
    return fit_figure(fig)


def _central_range(table, conditions: list[str], mass: float, eps: float) -> list[float]:
    """x range of the bins that hold the central ``mass`` of every condition, and the band."""
    low, high = -2 * eps, 2 * eps
    tail = (1 - mass) / 2
    for c in conditions:
        rows = table[table["condition"].astype(str) == c].sort_values("center")
        centers, cum = rows["center"].tolist(), rows["fraction"].cumsum().tolist()
        total = cum[-1] if cum else 0.0
        if not total:
            continue
        inside = [x for x, before, upto in zip(centers, [0.0, *cum[:-1]], cum, strict=True)
                  if upto >= tail * total and before <= (1 - tail) * total]
        low, high = min(low, inside[0]), max(high, inside[-1])
    return [low, high]
