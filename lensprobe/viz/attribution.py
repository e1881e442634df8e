"""Figures of head attribution: a layer x head heatmap of estimates, and estimate vs exact effect.

They take an :class:`~lensprobe.experiments.attribution.Attribution` and a
:class:`~lensprobe.experiments.verify.Verification` (or their tables) and draw them; nothing
is computed here. Heads are 0-based, TransformerLens-style ("L0H13" is the papers' "layer 1,
head 14").
"""

import plotly.graph_objects as go

from lensprobe.viz.fit import fit_figure
from lensprobe.viz.style import ABLATED_COLOR, CLEAN_COLOR, INDEX_NOTE, cell_labels, grid_layout

__all__ = ["attribution_heatmap", "attribution_scatter", "find_heads_heatmap", "find_heads_scatter"]

WHY_COLORS = {"flagged": ABLATED_COLOR, "verified": "#2a9d8f", "sampled": CLEAN_COLOR, "per prompt": "#e9c46a",
              "swept": "#6c757d"}
WHY_TEXT = {"flagged": "flagged (large write to the residual)", "verified": "verified in AtP order",
            "sampled": "random check", "per prompt": "on single prompts, in their AtP order",
            "swept": "the sweep (no AtP estimate)"}


def attribution_heatmap(attribution, *, title: str | None = None, zmax: float | None = None):
    """Layer x head heatmap of an attribution's estimates (mean over prompts).

    Args:
        attribution: an :class:`~lensprobe.experiments.attribution.Attribution`.
        title: figure title (default names the method and metric).
        zmax: colour scale limit (symmetric around 0; default: the largest |estimate|).

    Returns:
        A plotly ``Figure``; red = the metric is estimated to rise when the head is ablated,
        blue = to fall; blank cells were not estimated. Columns are KV groups for ``unit="kv"``.

    Example:
        >>> fig = attribution_heatmap(lp.attribute_heads(model, prompts, "entropy", method="atp*"))
    """
    grid = attribution.grid()
    values = grid.tolist()
    finite = grid[grid == grid]
    lim = zmax if zmax is not None else (float(finite.abs().max()) if finite.numel() else 1.0) or 1.0
    kv = attribution.unit == "kv"
    text = cell_labels(attribution, range(grid.shape[0]), range(grid.shape[1]), "KV" if kv else "H", "not estimated")
    method = {"atp": "AtP", "atp*": "AtP*"}.get(attribution.method, attribution.method)
    fig = go.Figure(go.Heatmap(
        z=values, x=list(range(grid.shape[1])), y=list(range(grid.shape[0])), text=text, zmin=-lim, zmax=lim,
        zmid=0.0, colorscale="RdBu_r", colorbar=dict(title=dict(text=f"est. Δ {attribution.metric}")),
        hovertemplate="%{text}<br>estimated Δ = %{z:.4g}<extra></extra>"))
    head_title = title or f"{method} estimate of the change in {attribution.metric} when ablating each " + (
        "KV group" if kv else "head")
    note = (f"{INDEX_NOTE}; mean over {attribution.estimates.shape[0]} prompt(s); verify the top candidates by "
            "exact ablation")
    fig.update_layout(
        **grid_layout(head_title, note, grid.shape[0], grid.shape[1]),
        xaxis=dict(title_text="KV group (0-based)" if kv else "head (0-based)", dtick=1),
        yaxis=dict(title_text="layer (0-based)", autorange="reversed"), template="plotly_white",
    )
    return fit_figure(fig)


def attribution_scatter(verification, *, title: str | None = None):
    """Estimated vs exact change for every verified head, with the line estimate = exact.

    Args:
        verification: a :class:`~lensprobe.experiments.verify.Verification` (or its ``table``
            with ``head_label``, ``estimate``, ``exact``, ``chosen``).
        title: figure title.

    Returns:
        A plotly ``Figure``: top candidates and sampled heads in two colours; points off the
        diagonal are where the attribution is wrong.

    Example:
        >>> fig = attribution_scatter(lp.verify_attribution(model, prompts, "entropy", att, top=20))
    """
    table = getattr(verification, "table", verification)
    fig = go.Figure()
    for chosen, color, name in (("top", ABLATED_COLOR, "top candidates"), ("sample", CLEAN_COLOR, "random sample")):
        rows = table[table["chosen"] == chosen]
        if len(rows):
            fig.add_trace(go.Scatter(
                x=rows["exact"].tolist(), y=rows["estimate"].tolist(), mode="markers", name=name,
                text=rows["head_label"].tolist(), marker=dict(color=color, size=8),
                hovertemplate="%{text}<br>exact %{x:.4g}<br>estimate %{y:.4g}<extra></extra>"))
    both = table["exact"].tolist() + table["estimate"].tolist()
    lo, hi = (min(both), max(both)) if both else (0.0, 1.0)
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="estimate = exact",
                             line=dict(color="gray", dash="dash"), hoverinfo="skip"))
    stats = ""
    if hasattr(verification, "spearman"):
        stats = f"Spearman {verification.spearman:.3f}, {verification.recall_text()}; "
    method = getattr(verification, "method", "attribution")
    fig.update_layout(
        title=dict(text=f"{title or f'{method} estimate vs exact ablation'}<br><sup>{stats}{INDEX_NOTE}; "
                        "mean over prompts</sup>"),
        xaxis_title=f"exact Δ {getattr(verification, 'metric', 'metric')} (ablated - clean)",
        yaxis_title="estimated Δ", template="plotly_white", height=480, width=620,
        margin=dict(t=100, l=80, r=30, b=60),
    )
    return fit_figure(fig)


def find_heads_scatter(search, *, title: str | None = None):
    """AtP's estimate vs the exact change of every head :func:`~lensprobe.experiments.findheads.find_heads`
    ablated exactly, coloured by why it was ablated (flagged outside the linear regime, verified in AtP
    order, drawn for the random check, or verified on single prompts: those points are means over the
    prompts each head was ablated on), with the line estimate = exact.

    Example:
        >>> fig = find_heads_scatter(lp.find_heads(model, prompts, "entropy"))
    """
    table = search.table
    fig = go.Figure()
    for why, color in WHY_COLORS.items():
        rows = table[table["why"] == why]
        if len(rows):
            fig.add_trace(go.Scatter(
                x=rows["exact"].tolist(), y=rows["estimate"].tolist(), mode="markers", name=WHY_TEXT[why],
                text=rows["head_label"].tolist(), customdata=rows[["write", "prompts"]].values.tolist(),
                marker=dict(color=color, size=8),
                hovertemplate="%{text}<br>exact %{x:.4g}<br>AtP %{y:.4g}<br>write %{customdata[0]:.2f}"
                              "<br>on %{customdata[1]} prompts<extra></extra>"))
    both = table["exact"].tolist() + table["estimate"].tolist()
    lo, hi = (min(both), max(both)) if both else (0.0, 1.0)
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="estimate = exact",
                             line=dict(color="gray", dash="dash"), hoverinfo="skip"))
    fig.update_layout(
        title=dict(text=f"{title or 'AtP estimate vs exact ablation, by why each head was ablated'}<br><sup>"
                        f"{search.recall_text()}; {INDEX_NOTE}</sup>"),
        xaxis_title=f"exact Δ {search.metric} (ablated - clean, mean over the prompts ablated on)",
        yaxis_title="AtP estimate",
        template="plotly_white", height=480, width=680, margin=dict(t=100, l=80, r=30, b=60))
    return fit_figure(fig)


def find_heads_heatmap(search, *, title: str | None = None):
    """Layer x head heatmap of the exact effects :func:`~lensprobe.experiments.findheads.find_heads`
    measured (blank: not ablated exactly; a head ablated on some prompts only shows their mean).

    Example:
        >>> fig = find_heads_heatmap(lp.find_heads(model, prompts, "entropy"))
    """
    att = search.attribution
    z: list[list[float | None]] = [[None] * att.n_heads for _ in range(att.n_layers)]
    for row in search.table.itertuples():
        z[int(row.layer)][int(row.head)] = float(row.exact)
    lim = max((abs(float(v)) for v in search.table["exact"]), default=1.0) or 1.0
    text = [[f"L{lay}H{h}" for h in range(att.n_heads)] for lay in range(att.n_layers)]
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(att.n_heads)), y=list(range(att.n_layers)), text=text, zmin=-lim, zmax=lim, zmid=0.0,
        colorscale="RdBu_r", colorbar=dict(title=dict(text=f"Δ {search.metric}")),
        hovertemplate="%{text}<br>exact Δ = %{z:.4g}<extra></extra>"))
    fig.update_layout(
        **grid_layout(title or f"Exact change in {search.metric} of the heads find_heads ablated",
                      f"{INDEX_NOTE}; blank: not ablated exactly; mean over the prompts each head was ablated on",
                      att.n_layers, att.n_heads),
        xaxis=dict(title_text="head (0-based)", dtick=1), yaxis=dict(title_text="layer (0-based)", autorange="reversed"),
        template="plotly_white")
    return fit_figure(fig)
