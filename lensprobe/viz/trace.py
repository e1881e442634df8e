"""Generation-trace figures: entropy and attention onto thinking tokens per generation step.

The figure function takes the table of :func:`lensprobe.generation.trace_summary` (mean and band per
condition, metric and step), draws it as it is and returns the figure; nothing is computed
here and nothing is shown.
"""

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lensprobe.viz.fit import fit_figure
from lensprobe.viz.style import TRACE_COLORS, rgba

RANGES = {"entropy": (0.0, None), "attention": (0.0, 1.0)}
"""The values each metric can take: a band (mean +- std) reaching past them is drawn clipped there."""
CLIPPED = {"entropy": "clipped at 0", "attention": "clipped to 0-1"}


def _clip(values, low: float | None, high: float | None) -> list[float]:
    """``values`` with those below ``low`` or above ``high`` drawn at that bound (NaN kept)."""
    out = []
    for v in (float(x) for x in values):
        if low is not None and v < low:
            v = low
        if high is not None and v > high:
            v = high
        out.append(v)
    return out


def generation_trace_figure(summary, *, title: str | None = None, band_label: str | None = None,
                            attention_label: str | None = None, height: int = 420):
    """The LT-Tuning two-panel chart: (a) entropy per step, (b) attention onto a token set per step.

    One line per condition (the mean across samples or prompts) with a shaded band (the
    band of the summary: std or 95% CI), drawn clipped to the values the quantity can take (entropy at 0,
    the attention proportion at 0 and 1: a mean +- std band would otherwise reach below 0); the hover gives
    the band's own ends. Step 0 is the last prompt position.

    Args:
        summary: the DataFrame of :func:`lensprobe.generation.trace_summary` (columns ``condition``,
            ``metric``, ``set``, ``step``, ``mean``, ``lower``, ``upper``).
        title: figure title.
        band_label: text for the band in the legend hover, e.g. ``"mean ± std over 4 samples"``.
        attention_label: y-axis title of panel (b) (default: "attention proportion onto <set>").
        height: figure height in pixels.

    Returns:
        A plotly ``Figure`` with two panels side by side.

    Example:
        >>> df = lp.generation.trace_summary({"LatentFusion": t1, "Pause": t2}, band="std", smooth=5)
        >>> lp.viz.generation_trace_figure(df, title="SmolLM2, MATH-500").write_html("trace.html")
    """
    sets = [s for s in summary.loc[summary["metric"] == "attention", "set"].unique() if s]
    set_name = sets[0] if sets else "tracked set"
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.09, subplot_titles=(
        "(a) next-token entropy per step", f"(b) attention proportion onto {set_name} per step"))
    conditions = list(dict.fromkeys(summary["condition"]))
    for i, cond in enumerate(conditions):
        color = TRACE_COLORS[i % len(TRACE_COLORS)]
        for col, metric in ((1, "entropy"), (2, "attention")):
            rows = summary[(summary["condition"] == cond) & (summary["metric"] == metric)].sort_values("step")
            if rows.empty:
                continue
            x = rows["step"].tolist()
            low, high = RANGES[metric]
            fig.add_trace(go.Scatter(
                x=x + x[::-1], y=_clip(rows["upper"], low, high) + _clip(rows["lower"], low, high)[::-1],
                fill="toself", fillcolor=rgba(color, 0.18), line=dict(width=0), hoverinfo="skip", showlegend=False,
                legendgroup=cond, name=f"{cond} band ({CLIPPED[metric]})"), row=1, col=col)
            fig.add_trace(go.Scatter(
                x=x, y=rows["mean"].tolist(), mode="lines", line=dict(color=color, width=2), name=cond,
                legendgroup=cond, showlegend=col == 1,
                customdata=list(zip(rows["lower"].tolist(), rows["upper"].tolist(), strict=True)),
                hovertemplate=f"{cond}<br>step %{{x}}<br>%{{y:.4f}} (band %{{customdata[0]:.4f}} to "
                              f"%{{customdata[1]:.4f}}, drawn {CLIPPED[metric]})"
                              + (f"<br>{band_label}" if band_label else "") + "<extra></extra>"), row=1, col=col)
    fig.update_xaxes(title_text="generation step (0 = last prompt position)")
    fig.update_yaxes(title_text="entropy (nats)", row=1, col=1)
    fig.update_yaxes(title_text=attention_label or f"attention proportion onto {set_name}", row=1, col=2)
    fig.update_layout(
        height=height, template="plotly_white", margin=dict(t=110, l=60, r=20, b=60),
        title=dict(text=f"{title or 'Entropy and attention per generation step'}<br><sup>lines: mean; shaded: "
                        f"{band_label or 'the band'}, drawn clipped to what each quantity can take (entropy at 0, "
                        "attention proportion at 0 and 1)</sup>", x=0, xref="paper"),
        legend=dict(orientation="h", yref="container", y=1 - 60 / height, yanchor="top", x=0, xanchor="left"),
    )
    return fit_figure(fig)
