"""Figures of the head studies: attention on one head per condition, the ablation sweep, patching results.

Functions take results (tidy DataFrames, :class:`~lensprobe.experiments.sweep.SweepResult`) and draw
them; nothing is computed here and nothing is shown. Heads are labelled 0-based,
TransformerLens-style ("L0H13" is the papers' "layer 1, head 14").
"""

from collections.abc import Sequence

import plotly.graph_objects as go

from lensprobe.core.errors import LensprobeError
from lensprobe.viz.fit import fit_figure
from lensprobe.viz.style import (
    ABLATED_COLOR,
    CLEAN_COLOR,
    GENERATED_COLOR,
    INDEX_NOTE,
    cell_labels,
    condition_colors,
    condition_label,
    grid_layout,
    table_of,
    table_spelling,
    unique,
)


def head_attention_figure(result, layer: int, head: int, *, conditions: Sequence[str] | None = None,
                          title: str | None = None, log_y: bool = False):
    """The paper's "average attention on head H": one line per condition over aligned positions.

    Works for the prompt alone (the table of
    :func:`~lensprobe.studies.filler.attention_received_by_condition`) and for prompt plus generated
    tokens (:func:`~lensprobe.studies.heads.head_attention_over_generation`); rows whose
    ``segment`` is ``"generated"`` are shaded, with a line where generation starts.

    Args:
        result: a result with a ``table`` or the DataFrame itself, with columns
            ``condition``, ``layer``, ``head``, ``aligned_pos``, ``token``, ``segment``,
            ``attention``.
        layer, head: the head to draw (0-based).
        conditions: which conditions, in order, any spelling (default: all in the table).
        title: figure title.
        log_y: logarithmic y axis (position 0 often takes most of the attention).

    Returns:
        A plotly ``Figure``.

    Example:
        >>> res = lp.studies.attention_received_by_condition(model, q, layers=[0], heads=[3])
        >>> fig = head_attention_figure(res, 0, 3)
    """
    t = table_of(result)
    sel = t[(t["layer"] == layer) & (t["head"] == head) & t["aligned_pos"].notna()]
    present = unique(sel["condition"])
    conds = [table_spelling(c, present) for c in conditions] if conditions is not None else present
    fig = go.Figure()
    gen_start = add_head_lines(fig, sel, conds)
    if gen_start is not None:
        fig.add_vrect(x0=gen_start - 0.5, x1=int(sel["aligned_pos"].max()) + 0.5, fillcolor=GENERATED_COLOR,
                      opacity=0.2, line_width=0, layer="below", annotation_text="generated tokens",
                      annotation_position="top left", annotation_font_size=10)
    if log_y:
        fig.update_yaxes(type="log")
    label = f"L{layer}H{head}"
    head_title = title or f"Average attention on head {label}"
    fig.update_layout(
        title=dict(text=f"{head_title}<br><sup>{INDEX_NOTE} (so {label} is the papers' layer {layer + 1}, "
                        f"head {head + 1}); mean over later queries i &gt; j; filler span dropped</sup>"),
        xaxis_title="token position (aligned: prompt without filler"
                    + (", then generated tokens)" if gen_start is not None else ")"),
        yaxis_title="avg attention received", template="plotly_white", height=460,
        legend=dict(title_text="condition"), margin=dict(t=110, l=80, r=30, b=60),
    )
    return fit_figure(fig)


def add_head_lines(fig, rows_of_head, conditions: Sequence[str]) -> int | None:
    """One line per condition over the aligned positions; returns the first aligned position of a
    generated token (``None`` when nothing was generated)."""
    hover = "%{customdata}<br>aligned position %{x}<br>attention %{y:.4f}<extra>%{fullData.name}</extra>"
    colors = condition_colors(conditions)
    gen_starts = []
    for c in conditions:
        rows = rows_of_head[rows_of_head["condition"] == c].sort_values("aligned_pos")
        fig.add_trace(go.Scatter(
            x=rows["aligned_pos"].astype(int).tolist(), y=rows["attention"].tolist(),
            customdata=rows["token"].tolist(), mode="lines", name=condition_label(c),
            line=dict(color=colors[c], width=1.5), hovertemplate=hover))
        gen = rows.loc[rows["segment"] == "generated", "aligned_pos"]
        if len(gen):
            gen_starts.append(int(gen.min()))
    return min(gen_starts) if gen_starts else None


def sweep_heatmap(result, *, title: str | None = None, zmax: float | None = None):
    """Heatmap of a head-ablation sweep or of per-head patching: metric change per (layer, head).

    Args:
        result: a :class:`~lensprobe.experiments.sweep.SweepResult` or
            :class:`~lensprobe.experiments.headpatch_result.HeadPatch`, its ``table`` (a [layer, head] DataFrame
            of mean changes), or its ``grid()`` (a ``[layer, head]`` tensor or array).
        title: figure title (default names the metric and method).
        zmax: colour scale limit (symmetric around 0; default: the largest |change|).

    Returns:
        A plotly ``Figure``; red = the metric rises when the head is ablated (patched), blue = it falls;
        blank cells were not swept (hover: "not swept"; a swept head whose metric is NaN says so).

    Raises:
        LensprobeError: a grid that is not two-dimensional.

    Example:
        >>> fig = sweep_heatmap(lp.ablation_sweep(model, prompt, "entropy"))
    """
    table = grid_table(getattr(result, "table", result))
    attrs = getattr(table, "attrs", {}) or {}
    metric = getattr(result, "metric", attrs.get("metric", "metric"))
    method = getattr(result, "method", attrs.get("method", ""))
    pairs = getattr(result, "n_pairs", attrs.get("pairs", 1))
    values = table.to_numpy()
    layers = [int(v) for v in table.index]
    heads = [int(v) for v in table.columns]
    finite = values[values == values]  # drop NaN
    lim = zmax if zmax is not None else (float(abs(finite).max()) if finite.size else 1.0) or 1.0
    text = cell_labels(result, layers, heads, "H", "not swept")
    fig = go.Figure(go.Heatmap(
        z=values.tolist(), x=heads, y=layers, text=text, zmin=-lim, zmax=lim, zmid=0.0,
        colorscale="RdBu_r", colorbar=dict(title=dict(text=f"Δ {metric}")),
        hovertemplate="%{text}<br>Δ " + metric + " = %{z:.4g}<extra></extra>"))
    if method == "patch":  # lp.patch_heads: each head's output from the other prompt
        head_title = title or f"Change in {metric} when each head is patched from the other prompt"
        note = "patched - clean" + (f", mean over {pairs} pairs" if pairs != 1 else "")
    elif not method and not hasattr(result, "table"):  # a bare grid: its values, unnamed
        head_title = title or "Change per head"
        note = "the values given per (layer, head)"
    else:
        head_title = title or f"Change in {metric} when ablating each head" + (f" ({method} ablation)" if method else "")
        note = "ablated - baseline, mean over prompts"
    fig.update_layout(
        **grid_layout(head_title, f"{INDEX_NOTE}; {note}", len(layers), len(heads)),
        xaxis=dict(title_text="head (0-based)", dtick=1), yaxis=dict(title_text="layer (0-based)", autorange="reversed"),
        template="plotly_white",
    )
    return fit_figure(fig)


def grid_table(grid):
    """A ``[layer, head]`` tensor or array as the DataFrame :func:`sweep_heatmap` draws (a DataFrame as it is).

    Raises:
        LensprobeError: a grid that is not two-dimensional.
    """
    if hasattr(grid, "to_numpy") and hasattr(grid, "columns"):
        return grid
    import numpy as np
    import pandas as pd

    array = grid.detach().cpu().float().numpy() if hasattr(grid, "detach") else np.asarray(grid, dtype=float)
    if array.ndim != 2:
        raise LensprobeError(f"a [layer, head] grid has two dimensions, got shape {tuple(array.shape)}: pass a "
                             "result, its .table or its .grid().")
    df = pd.DataFrame(array, columns=list(range(array.shape[1])))
    df.index.name, df.columns.name = "layer", "head"
    return df


def next_token_figure(effect, *, title: str | None = None):
    """Next-token probabilities with and without an ablation (grouped bars, one pair per token).

    Args:
        effect: an :class:`~lensprobe.studies.heads.AblationEffect` (or its ``tokens`` DataFrame
            with ``token``, ``p_clean``, ``p_ablated``).
        title: figure title.

    Returns:
        A plotly ``Figure``.
    """
    t = getattr(effect, "tokens", effect)
    labels = [repr(tok)[1:-1] or "(empty)" for tok in t["token"]]
    fig = go.Figure([
        go.Bar(x=labels, y=t["p_clean"].tolist(), name="clean", marker_color=CLEAN_COLOR),
        go.Bar(x=labels, y=t["p_ablated"].tolist(), name="ablated", marker_color=ABLATED_COLOR),
    ])
    summary = getattr(effect, "summary", None)
    sub = (f"entropy {summary['entropy_clean']:.3f} → {summary['entropy_ablated']:.3f} nats; "
           f"KL {summary['kl']:.4f} nats" if summary else "")
    fig.update_layout(
        barmode="group", template="plotly_white", height=420,
        title=dict(text=f"{title or 'Next-token probabilities with and without the ablation'}<br><sup>{sub}</sup>"),
        xaxis_title="token (top tokens of either run)", yaxis_title="probability",
        margin=dict(t=100, l=70, r=30, b=80),
    )
    return fit_figure(fig)


def patch_figure(result, *, value: str = "share", title: str | None = None):
    """Activation patching results as a heatmap: hook points (rows) x segments (columns).

    Args:
        result: a :class:`~lensprobe.experiments.patching.PatchResult` (or its ``to_dataframe()``).
        value: the column to colour by: ``"share"`` (share of the source-target difference
            a site carries over; the default), ``"change"`` (patched - clean) or ``"kl"``.
        title: figure title.

    Returns:
        A plotly ``Figure``; each cell shows its value, the hover its clean and patched
        metric, change and KL. The row patching every site at once ("all sites") is given
        in the subtitle.
    """
    if value not in ("share", "change", "kl"):
        raise ValueError(f"value must be 'share', 'change' or 'kl', got {value!r}.")
    df = result.to_dataframe() if hasattr(result, "to_dataframe") else result
    single, combined = df[df["site"] != "all sites"], df[df["site"] == "all sites"]
    hooks, segments = unique(single["hook"]), unique(single["segment"])
    cell = {(r.hook, r.segment): r for r in single.itertuples()}
    z, text, hover = [], [], []
    for hook in hooks:
        rows = [cell.get((hook, seg)) for seg in segments]
        values = [None if r is None else float(getattr(r, value)) for r in rows]
        z.append(values)
        text.append(["" if v is None or v != v else f"{v:.3f}" for v in values])
        hover.append(["" if r is None else
                      f"{r.site}<br>clean {r.clean:.4f} → patched {r.patched:.4f}<br>change {r.change:+.4f}"
                      f"<br>share {r.share:.3f}<br>KL {r.kl:.4f} nats<br>{r.n_positions} positions" for r in rows])
    label = {"share": "share of the source-target difference", "change": "patched − clean",
             "kl": "KL from the clean run (nats)"}[value]
    heat = go.Heatmap(z=z, x=segments, y=hooks, text=text, texttemplate="%{text}", customdata=hover,
                      hovertemplate="%{customdata}<extra></extra>", colorbar=dict(title=value),
                      colorscale="Viridis" if value == "kl" else "RdBu_r", zmid=None if value == "kl" else 0)
    metric = getattr(result, "metric", None)
    first = df.iloc[0] if len(df) else None
    sub = ""
    if first is not None:
        sub = f"{metric or 'metric'}: clean target {first['clean']:.4f}, source {first['source']:.4f}"
    if len(combined):
        c = combined.iloc[0]
        sub += f"; all sites at once: {value} {float(c[value]):.3f}"
    fig = go.Figure(heat)
    fig.update_layout(
        template="plotly_white", height=max(300, 90 + 60 * len(hooks)),
        title=dict(text=f"{title or 'Activation patching: ' + label}<br><sup>{sub}</sup>"),
        xaxis_title="segment (positions copied from the source)", yaxis_title="hook point",
        yaxis=dict(autorange="reversed"), margin=dict(t=100, l=220, r=30, b=70),
    )
    return fit_figure(fig)
