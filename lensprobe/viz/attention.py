"""Attention figures of the meaningless-tokens study (plotly) and a circuitsvis attention view.

Every function takes the tidy tables of :mod:`lensprobe.studies.filler` (or the result
dataclasses that hold them), draws them as they are and returns the figure; nothing is
computed here and nothing is shown. Heads are labelled 0-based, TransformerLens-style
("L0H13" is the papers' "layer 1, head 14").
"""

import html
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lensprobe.core.lazy import heavy
from lensprobe.viz.fit import fit_figure
from lensprobe.viz.style import (
    CLASS_COLORS,
    INDEX_NOTE,
    SPAN_COLOR,
    color,
    condition_colors,
    condition_label,
    filler_span,
    header,
    table_of,
    table_spelling,
    unique,
    vspacing,
)

HOVER = "%{customdata}<br>position %{x}<br>attention %{y:.4f}<extra>%{fullData.name}</extra>"


def attention_received_figure(result, pairs: Sequence[tuple[int, int]] | None = None, *,
                              conditions: Sequence[str] | None = None, shade_condition: str = "w/ Mless",
                              title: str | None = None, log_y: bool = False):
    """Average attention received per position, with vs without filler, one row per (layer, head).

    Left panel: every condition on the aligned axis (filler span dropped, so position k is
    the same token in each). Right panel: the ``shade_condition`` prompt over all of its
    positions with the filler span shaded (the paper's figure "attention weights with and
    without meaningless tokens"). Without any filler condition only the left panel is drawn.

    Args:
        result: an :class:`~lensprobe.studies.filler.AttentionReceived` or its ``table``.
        pairs: ``[(layer, head), ...]`` rows to draw (default: every pair in the table).
        conditions: conditions on the left panel, any spelling (default: all in the table).
        shade_condition: the with-filler condition on the right panel.
        title: figure title.
        log_y: logarithmic y axis (position 0 often takes most of the attention).

    Returns:
        A plotly ``Figure``.

    Example:
        >>> fig = attention_received_figure(lp.studies.attention_received_by_condition(model, "What is 12+7?", layers=[0]),
        ...                                 [(0, 3)])
    """
    t = table_of(result)
    present = unique(t["condition"])
    if pairs is None:
        pairs = unique(zip(t["layer"].tolist(), t["head"].tolist(), strict=True))
    pairs = [(int(a), int(b)) for a, b in pairs]
    conditions = [table_spelling(c, present) for c in conditions] if conditions is not None else present
    shade = shaded_condition(t, present, shade_condition)
    colors = condition_colors(conditions + ([shade] if shade else []))
    height = 140 + 250 * len(pairs)
    fig = make_subplots(rows=len(pairs), cols=2 if shade else 1, subplot_titles=received_titles(len(pairs), shade),
                        horizontal_spacing=0.07, vertical_spacing=vspacing(len(pairs), 70, height))
    for r, (layer, head) in enumerate(pairs, start=1):
        sel = t[(t["layer"] == layer) & (t["head"] == head)]
        add_aligned_lines(fig, sel, conditions, colors, row=r)
        fig.update_yaxes(title_text=f"<b>L{layer}H{head}</b><br>avg attention received", row=r, col=1)
        if shade:
            add_shaded_line(fig, sel[sel["condition"] == shade], shade, colors[shade], row=r)
    if log_y:
        fig.update_yaxes(type="log")
    fig.update_xaxes(title_text="position in the prompt without filler", row=len(pairs), col=1)
    if shade:
        fig.update_xaxes(title_text=f"position in the {condition_label(shade)} prompt", row=len(pairs), col=2)
    heading = title or "Average attention received per token position, with vs without filler"
    fig.update_layout(
        **header(f"{heading}<br><sup>{INDEX_NOTE}; mean over later queries i &gt; j</sup>", height, "condition: "),
        height=height, template="plotly_white", hovermode="closest",
        margin=dict(t=120, l=90, r=30, b=60),
    )
    return fit_figure(fig)


def shaded_condition(table, present: Sequence[str], wanted: str) -> str | None:
    """The condition drawn over its full prompt: ``wanted`` if it has a filler span, else the first
    condition that has one (``None`` when none has)."""
    with_filler = [c for c in present if (table.loc[table["condition"] == c, "segment"] == "filler").any()]
    wanted = table_spelling(wanted, present)
    return wanted if wanted in with_filler else (with_filler[0] if with_filler else None)


def received_titles(n_rows: int, shade: str | None) -> list[str]:
    """Panel titles: on the first row only, the aligned panel's and the shaded panel's."""
    first = ["aligned: filler span dropped"]
    if shade:
        first.append(f"{condition_label(shade)} prompt, filler span shaded")
    return first + [""] * (len(first) * (n_rows - 1))


def add_aligned_lines(fig, rows_of_head, conditions: Sequence[str], colors: dict[str, str], *, row: int) -> None:
    """One line per condition over the aligned positions of one (layer, head), in the left panel."""
    for c in conditions:
        rows = rows_of_head[(rows_of_head["condition"] == c) & rows_of_head["aligned_pos"].notna()]
        fig.add_trace(go.Scatter(
            x=rows["aligned_pos"].astype(int).tolist(), y=rows["attention"].tolist(),
            customdata=rows["token"].tolist(), mode="lines", name=condition_label(c),
            legendgroup=c, showlegend=row == 1, line=dict(color=colors[c], width=1.5),
            hovertemplate=HOVER), row=row, col=1)


def add_shaded_line(fig, rows, condition: str, line_color: str, *, row: int) -> None:
    """The with-filler condition over all of its positions, the filler span shaded, in the right panel."""
    span = filler_span(rows)
    fig.add_trace(go.Scatter(
        x=rows["position"].tolist(), y=rows["attention"].tolist(), customdata=rows["token"].tolist(),
        mode="lines", name=condition_label(condition), legendgroup=condition, showlegend=False,
        line=dict(color=line_color, width=1.5), hovertemplate=HOVER), row=row, col=2)
    if span:
        note = (dict(annotation_text=f"filler {span[0]}-{span[1] - 1}", annotation_position="top left",
                     annotation_font_size=10) if row == 1 else {})
        fig.add_vrect(x0=span[0] - 0.5, x1=span[1] - 0.5, fillcolor=SPAN_COLOR, opacity=0.25,
                      line_width=0, layer="below", row=row, col=2, **note)


def filler_vs_random_figure(result, *, title: str | None = None, cols: int = 3):
    """Filler vs a random sentence of the same token count, one panel per model.

    Args:
        result: a :class:`~lensprobe.studies.filler_random.FillerVsRandom` or its ``table``
            (columns ``model``, ``condition``, ``head_label``, ``position``, ``token``,
            ``segment``, ``attention``).
        title: figure title.
        cols: panels per row.

    Returns:
        A plotly ``Figure``; the shaded band is the filler / sentence span.
    """
    t = table_of(result)
    models = unique(t["model"])
    ncols = max(1, min(cols, len(models)))
    nrows = -(-len(models) // ncols)
    heads = {m: ", ".join(unique(t.loc[t["model"] == m, "head_label"])) for m in models}
    height = 160 + 320 * nrows
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=[f"{m} · {heads[m]}" for m in models],
                        horizontal_spacing=0.08, vertical_spacing=vspacing(nrows, 80, height))
    colors = condition_colors(unique(t["condition"]))
    for k, m in enumerate(models):  # one panel per model
        r, c = k // ncols + 1, k % ncols + 1
        sel = t[t["model"] == m]
        for cond in unique(sel["condition"]):
            rows = sel[sel["condition"] == cond]
            fig.add_trace(go.Scatter(
                x=rows["position"].tolist(), y=rows["attention"].tolist(), customdata=rows["token"].tolist(),
                mode="lines", name=condition_label(cond), legendgroup=cond, showlegend=k == 0,
                line=dict(color=colors[cond], width=1.5), hovertemplate=HOVER),
                row=r, col=c)
        span = filler_span(sel)
        if span:
            fig.add_vrect(x0=span[0] - 0.5, x1=span[1] - 0.5, fillcolor=SPAN_COLOR, opacity=0.25, line_width=0,
                          layer="below", row=r, col=c, annotation_text=f"filler / sentence {span[0]}-{span[1] - 1}",
                          annotation_position="top left", annotation_font_size=10)
        fig.update_xaxes(title_text="token position", row=r, col=c)
        fig.update_yaxes(title_text="avg attention received" if c == 1 else None, row=r, col=c)
    head = title or "Filler tokens vs a random sentence of the same length"
    fig.update_layout(
        **header(f"{head}<br><sup>{INDEX_NOTE}</sup>", height), height=height, template="plotly_white",
        margin=dict(t=120, l=80, r=30, b=60),
    )
    return fit_figure(fig)


def condition_change_figure(table, *, title: str | None = None):
    """Grouped bars: how much each filler condition changes each head's attention, vs no filler.

    Args:
        table: the DataFrame of :func:`~lensprobe.studies.filler.condition_changes`
            (columns ``condition``, ``head_label``, ``change``).
        title: figure title.

    Returns:
        A plotly ``Figure``: x is the head, one bar per condition.
    """
    fig = go.Figure()
    colors = condition_colors(unique(table["condition"]))
    for c in colors:
        rows = table[table["condition"] == c]
        fig.add_trace(go.Bar(x=rows["head_label"].tolist(), y=rows["change"].tolist(),
                             name=condition_label(c), marker_color=colors[c],
                             hovertemplate="%{x}: %{y:.4f}<extra>%{fullData.name}</extra>"))
    head = title or "Change of average attention received vs no filler, per head"
    fig.update_layout(
        barmode="group", template="plotly_white", height=420,
        **header(f"{head}<br><sup>mean over aligned positions of |condition - w/o filler|; {INDEX_NOTE}</sup>", 420),
        xaxis=dict(title_text="head", tickangle=-45, type="category"),
        yaxis=dict(title_text="mean |change|"),
        margin=dict(t=110, l=70, r=30, b=90),
    )
    return fit_figure(fig)


def segment_attention_figure(table, *, title: str | None = None):
    """The attention one prompt segment receives at each layer, one line per condition.

    Args:
        table: the DataFrame of :func:`~lensprobe.studies.segments.segment_attention` (columns
            ``condition``, ``layer``, ``segment``, ``positions``, ``attention``, ``sd``).
        title: figure title (default: the segment's name).

    Returns:
        A plotly ``Figure``: x is the layer (0-based), y the attention the segment receives, error bars
        one standard deviation over heads.

    Example:
        >>> lp.viz.segment_attention_figure(lp.studies.segment_attention(res, "question"))
    """
    segment = str(table["segment"].iloc[0]) if len(table) else "segment"
    colors = condition_colors(unique(table["condition"]))
    fig = go.Figure()
    for c in colors:
        rows = table[table["condition"] == c]
        fig.add_trace(go.Scatter(
            x=rows["layer"].tolist(), y=rows["attention"].tolist(), name=condition_label(c), mode="lines+markers",
            marker_color=colors[c], customdata=rows["positions"].tolist(),
            error_y=dict(type="data", array=rows["sd"].fillna(0).tolist(), thickness=1, width=3),
            hovertemplate="layer %{x}: %{y:.3f} (%{customdata} positions)<extra>%{fullData.name}</extra>"))
    head = title or f"Attention the {segment} receives, per layer"
    height = 440
    fig.update_layout(
        **header(f"{head}<br><sup>sum over its positions; mean over heads, bars ± 1 sd; layers 0-based</sup>",
                 height, "condition: "),
        height=height, template="plotly_white", margin=dict(t=120, l=80, r=30, b=60),
        xaxis=dict(title_text="layer", dtick=1 if table["layer"].nunique() <= 12 else None),
        yaxis=dict(title_text=f"attention received by the {segment}", rangemode="tozero"),
    )
    return fit_figure(fig)


def token_class_figure(table, *, title: str | None = None):
    """Stacked bars of attention per token class at each layer, groups (conditions or models) side by side.

    Args:
        table: the DataFrame of :func:`~lensprobe.studies.token_classes.compare_token_class_attention`
            (columns ``group``, ``layer``, ``layer_label``, ``token_class``, ``attention``,
            ``n_tokens``).
        title: figure title.

    Returns:
        A plotly ``Figure``: x is (layer, group), each bar stacks the classes.
    """
    t = table.sort_values("layer", kind="stable")
    layers = unique(t["layer_label"])
    groups = unique(table["group"])
    fig = go.Figure()
    for i, cls in enumerate(unique(t["token_class"])):
        rows = t[t["token_class"] == cls].set_index(["layer_label", "group"])
        xs: list[list] = [[], []]
        ys: list[float] = []
        ns: list[int] = []
        for layer in layers:
            for g in groups:
                if (layer, g) in rows.index:
                    xs[0].append(layer)
                    xs[1].append(g)
                    ys.append(float(rows.loc[(layer, g), "attention"]))
                    ns.append(int(rows.loc[(layer, g), "n_tokens"]))
        fig.add_trace(go.Bar(
            x=xs, y=ys, name=cls, customdata=ns, marker_color=color(cls, CLASS_COLORS, i),
            hovertemplate="%{x}<br>" + cls + ": %{y:.3f}<br>%{customdata} key tokens<extra></extra>"))
    head = title or "Attention per token class by layer"
    fig.update_layout(
        barmode="stack", template="plotly_white", height=480,
        title=dict(text=f"{head}<br><sup>share of an average query's attention (mean over queries and heads); "
                        "layers 0-based</sup>"),
        yaxis=dict(title_text="attention share", range=[0, 1.02]),
        legend=dict(title_text="key token class"), margin=dict(t=100, l=70, r=30, b=80),
    )
    return fit_figure(fig)


def attention_view_html(pattern: Any, str_tokens: Sequence[str], *, layer: int,
                        span: tuple[int, int] | None = None, span_name: str = "filler",
                        head_labels: Sequence[str] | None = None, caption: str | None = None) -> str:
    """A circuitsvis view of every head of one layer, as self-contained HTML (works offline).

    Tokens inside ``span`` are drawn as ``«token»`` and the caption names the span, so
    the filler is visible in the view.

    Args:
        pattern: ``[head, query_pos, key_pos]`` attention of one layer (tensor, array or lists).
        str_tokens: the prompt's token strings.
        layer: the layer index (0-based), for the head labels.
        span: half-open ``(start, end)`` token span to mark, e.g. ``prompt.segments["filler"]``.
        span_name: what the span is called in the caption.
        head_labels: names of the heads (default ``L{layer}H{h}``).
        caption: text above the view (default: layer, span and indexing note).

    Returns:
        An HTML string (a ``<figure>`` with circuitsvis' ``.local_src``: JavaScript inline).
    """
    attention_heads = heavy("circuitsvis.attention").attention_heads
    n_heads = len(pattern)
    labels = []
    for i, tok in enumerate(str_tokens):
        tok = tok.replace("</", "<\u200b/")  # keep the inline script intact
        labels.append(f"«{tok}»" if span and span[0] <= i < span[1] else tok)
    names = ([str(n).replace("</", "<\u200b/") for n in head_labels] if head_labels is not None
             else [f"L{layer}H{h}" for h in range(n_heads)])  # labels go into the inline script too
    if caption is None:
        where = (f" Tokens shown as «…» are the {span_name} span (positions {span[0]}-{span[1] - 1})."
                 if span else "")
        caption = f"Layer {layer}, all {n_heads} heads.{where} {INDEX_NOTE}."
    src = attention_heads(attention=pattern, tokens=labels, attention_head_names=names).local_src
    return (f'<figure class="lp-attention-view"><figcaption>{html.escape(caption)}</figcaption>'
            f"<div>{src}</div></figure>")
