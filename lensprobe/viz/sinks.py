"""Figures of attention sinks and massive activations (:func:`lensprobe.studies.attention_sinks`), and of
activations recorded per generation step (``record=`` of :func:`lensprobe.trace_generation`).

- :func:`sink_heatmap`: the attention mass on the first token (or a segment), layer x head, one panel per
  condition;
- :func:`sink_steps_figure`: that mass per generation step, mean over heads, a line per condition, a panel
  per layer;
- :func:`massive_activation_figure`: per layer, the largest ``|residual stream|`` entry over the median,
  a line per condition;
- :func:`activation_norm_figure`: a trace's recorded activations, their norm per step, as a layer x step
  heatmap or a line per layer.

They draw the tables as they are (the means over heads come from the result's ``head_means()`` and
``step_means()``); only :func:`activation_norm_figure` takes a norm, of the raw activations a trace holds.
Layers and heads are 0-based, as in TransformerLens.
"""

import re
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lensprobe.core.errors import LensprobeError
from lensprobe.viz.fit import fit_figure
from lensprobe.viz.style import (
    INDEX_NOTE,
    condition_colors,
    condition_label,
    header,
    unique,
    vspacing,
    wrap_note,
)

__all__ = ["activation_norm_figure", "massive_activation_figure", "sink_heatmap", "sink_steps_figure"]

FIRST = "first token"
"""The first token's target name in the study's tables."""


def _require(table: Any, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in getattr(table, "columns", ())]
    if missing:
        raise LensprobeError(f"not {what}: columns {missing} are missing.")


def _rows(table, target: str, what: str):
    rows = table[table["target"] == target]
    if rows.empty:
        raise LensprobeError(f"the {what} has no target {target!r}: use one of {unique(table['target'])}.")
    return rows


def _title(head: str, note: str, width: float) -> str:
    return f"{head}<br><sup>{'<br>'.join(wrap_note(note, width - 110))}</sup>"


def sink_heatmap(result, *, target: str = FIRST, title: str | None = None, zmax: float | None = None):
    """The attention mass on ``target`` per layer and head over the prompt, one panel per condition.

    Args:
        result: an :class:`~lensprobe.studies.sinks.AttentionSinks` (or its ``prompt`` table: columns
            ``condition``, ``layer``, ``head``, ``target``, ``mass``).
        target: ``"first token"`` (the attention sink) or a segment measured (``"filler"``).
        title: figure title.
        zmax: top of the shared colour scale (default: the largest mass shown).

    Returns:
        A plotly ``Figure``: one heatmap per condition (rows: layers, columns: heads), one colour scale.

    Example:
        >>> fig = sink_heatmap(lp.studies.attention_sinks(model, "What is 12+7?"))
    """
    table = getattr(result, "prompt", result)
    _require(table, ("condition", "layer", "head", "target", "mass"), "an attention_sinks prompt table")
    rows = _rows(table, target, "table")
    conditions = [str(c) for c in unique(rows["condition"])]
    layers = sorted(int(v) for v in unique(rows["layer"]))
    heads = sorted(int(v) for v in unique(rows["head"]))
    top = zmax if zmax is not None else float(rows["mass"].max())
    top = top if top == top and top > 0 else 1.0
    panel = 30 * len(heads) + 40
    width = max(520, 160 + len(conditions) * panel)
    note = f"{INDEX_NOTE}; mean over the prompt's queries after the {target}"
    head = title or f"Attention on the {target}, per layer and head"
    lines = len(wrap_note(note, width - 110))
    height = max(360, 150 + 18 * len(layers)) + 15 * lines
    fig = make_subplots(rows=1, cols=len(conditions), horizontal_spacing=min(0.04, 1 / len(conditions)),
                        subplot_titles=[condition_label(c) for c in conditions], shared_yaxes=True)
    for i, cond in enumerate(conditions, start=1):
        grid = (rows[rows["condition"].astype(str) == cond].pivot_table(index="layer", columns="head", values="mass",
                                                                        aggfunc="first", dropna=False)
                .reindex(index=layers, columns=heads))
        fig.add_trace(go.Heatmap(
            z=grid.to_numpy().tolist(), x=heads, y=layers, zmin=0.0, zmax=top, colorscale="Viridis",
            showscale=i == len(conditions), colorbar=dict(title=dict(text="mass")), name=cond,
            hovertemplate=f"{cond}<br>L%{{y}}H%{{x}}<br>mass %{{z:.4f}}<extra></extra>"), row=1, col=i)
        fig.update_xaxes(title_text="head", dtick=1 if len(heads) <= 16 else None, row=1, col=i)
    fig.update_yaxes(title_text="layer (0-based)", autorange="reversed", row=1, col=1)
    fig.update_yaxes(autorange="reversed")
    top_margin = 80 + 15 * lines
    fig.update_layout(title=dict(text=_title(head, note, width)), width=width, height=height,
                      template="plotly_white", margin=dict(t=top_margin, l=80, r=30, b=60))
    return fit_figure(fig)


def sink_steps_figure(result, *, target: str = FIRST, layers: Sequence[int] | None = None, title: str | None = None):
    """The attention mass on ``target`` per generation step (mean over heads), a line per condition and a
    panel per layer.

    Args:
        result: an :class:`~lensprobe.studies.sinks.AttentionSinks` (its ``step_means()``), or that table
            (columns ``condition``, ``step``, ``layer``, ``target``, ``mass``; ``token`` on hover).
        target: ``"first token"`` or a segment measured.
        layers: the layers drawn (default: every layer of the table, at most 6 of them evenly spread).
        title: figure title.

    Returns:
        A plotly ``Figure``: one panel per layer, one line per condition.

    Example:
        >>> fig = sink_steps_figure(res, layers=[3, 10])
    """
    table = result.step_means() if callable(getattr(result, "step_means", None)) else result
    _require(table, ("condition", "step", "layer", "target", "mass"), "an attention_sinks step table")
    rows = _rows(table, target, "table")
    have = sorted(int(v) for v in unique(rows["layer"]))
    if layers is None:
        chosen = have if len(have) <= 6 else [have[round(i * (len(have) - 1) / 5)] for i in range(6)]
    else:
        chosen = [int(v) for v in layers]
        absent = [v for v in chosen if v not in have]
        if absent or not chosen:
            raise LensprobeError(f"layers {absent or chosen} are not in the table: use some of {have}.")
    conditions = [str(c) for c in unique(rows["condition"])]
    colors = condition_colors(conditions)
    height = 140 + 170 * len(chosen)
    fig = make_subplots(rows=len(chosen), cols=1, shared_xaxes=True, vertical_spacing=vspacing(len(chosen), 40, height),
                        subplot_titles=[f"layer {v}" for v in chosen])
    for r, layer in enumerate(chosen, start=1):
        for cond in conditions:
            sub = rows[(rows["layer"] == layer) & (rows["condition"].astype(str) == cond)].sort_values("step")
            tokens = sub["token"].astype(str).tolist() if "token" in sub.columns else [""] * len(sub)
            fig.add_trace(go.Scatter(
                x=sub["step"].tolist(), y=sub["mass"].tolist(), mode="lines+markers", name=condition_label(cond),
                legendgroup=cond, showlegend=r == 1, line=dict(color=colors[cond], width=1.6), marker=dict(size=4),
                customdata=tokens, hovertemplate="step %{x}<br>token %{customdata}<br>mass %{y:.4f}"
                                                  "<extra>%{fullData.name}</extra>"), row=r, col=1)
        fig.update_yaxes(title_text="mass", rangemode="tozero", row=r, col=1)
    fig.update_xaxes(title_text="generation step (0 = last prompt position)", row=len(chosen), col=1)
    head = title or f"Attention on the {target} per generation step (mean over heads)"
    fig.update_layout(**header(f"{head}<br><sup>{INDEX_NOTE}</sup>", height, "condition: "), height=height,
                      template="plotly_white", margin=dict(t=120, l=80, r=30, b=60))
    return fit_figure(fig)


def massive_activation_figure(result, *, phase: str = "prompt", step: int = 0, title: str | None = None,
                              log_y: bool = True):
    """Per layer, the largest ``|residual stream|`` entry over the median ``|entry|``, a line per condition.

    Args:
        result: an :class:`~lensprobe.studies.sinks.AttentionSinks` (or its ``massive`` table).
        phase: ``"prompt"`` (over every prompt position) or ``"step"`` (the newest position at ``step``).
        step: the generation step drawn when ``phase="step"``.
        title: figure title.
        log_y: a logarithmic ratio axis.

    Returns:
        A plotly ``Figure``; hover: the entry's token, position, dimension and value.

    Example:
        >>> fig = massive_activation_figure(res)
    """
    table = getattr(result, "massive", result)
    _require(table, ("condition", "phase", "step", "layer", "rank", "ratio", "dim", "position", "token", "value"),
             "an attention_sinks massive table")
    if phase not in ("prompt", "step"):
        raise LensprobeError(f"phase must be 'prompt' or 'step', got {phase!r}.")
    rows = table[(table["phase"] == phase) & (table["rank"] == 0)]
    if phase == "step":
        rows = rows[rows["step"] == step]
    if rows.empty:
        raise LensprobeError(f"the table has no {phase} rows" + (f" at step {step}" if phase == "step" else "") + ".")
    conditions = [str(c) for c in unique(rows["condition"])]
    colors = condition_colors(conditions)
    height = 460
    fig = go.Figure()
    for cond in conditions:
        sub = rows[rows["condition"].astype(str) == cond].sort_values("layer")
        info = [[repr(str(t))[1:-1], int(p), int(d), float(v)]
                for t, p, d, v in zip(sub["token"], sub["position"], sub["dim"], sub["value"], strict=True)]
        fig.add_trace(go.Scatter(
            x=sub["layer"].tolist(), y=sub["ratio"].tolist(), mode="lines+markers", name=condition_label(cond),
            line=dict(color=colors[cond], width=1.6), customdata=info,
            hovertemplate="layer %{x}<br>ratio %{y:.4g}<br>token %{customdata[0]} (position %{customdata[1]})"
                          "<br>dim %{customdata[2]}, value %{customdata[3]:.4g}<extra>%{fullData.name}</extra>"))
    where = "over the prompt" if phase == "prompt" else f"at step {step}'s newest position"
    head = title or f"Largest |residual stream| entry over the median |entry|, {where}"
    fig.update_layout(**header(f"{head}<br><sup>{INDEX_NOTE}; blocks.L.hook_resid_post</sup>", height,
                               "condition: "),
                      height=height, template="plotly_white", margin=dict(t=120, l=80, r=30, b=60),
                      xaxis_title="layer (0-based)", yaxis_title="max |entry| / median |entry|",
                      yaxis_type="log" if log_y else "linear")
    return fit_figure(fig)


def _norms(trace, hook: str, row: int) -> tuple[list[int], list[list[float]]]:
    """``(layers, [layer][step] norms)`` of ``blocks.{layer}.{hook}`` in a trace's recorded values, for the
    steps the row ran."""
    pattern = re.compile(rf"blocks\.(\d+)\.{re.escape(hook)}")
    found = sorted((int(m.group(1)), name) for name in getattr(trace, "activations_rows", {})
                   if (m := pattern.fullmatch(name)))
    if not found:
        raise LensprobeError(f"the trace recorded no blocks.L.{hook}: generate with "
                             f"record='blocks.*.{hook}' (or a Record of it).")
    if not 0 <= row < trace.n_rows:
        raise LensprobeError(f"row {row} is out of range: the trace has {trace.n_rows} rows.")
    n = int(trace.recorded_rows[row].sum())
    values = []
    for _, name in found:
        v = trace.activations_rows[name][row, :n]
        values.append((v if v.ndim == 1 else v.reshape(n, -1).norm(dim=-1)).tolist())
    return [layer for layer, _ in found], values


def activation_norm_figure(traces, *, hook: str = "hook_resid_post", kind: str = "heatmap", row: int = 0,
                           title: str | None = None):
    """The norm of a trace's recorded activations per generation step, per layer.

    The values recorded at ``blocks.{layer}.{hook}`` (``record=`` of :func:`lensprobe.trace_generation`):
    their L2 norm per step when they are whole activations, as they are when the record already reduced
    each step to one number (``reduce=lambda x: x.norm(dim=-1)``).

    Args:
        traces: a :class:`~lensprobe.generation.GenerationTrace`, or ``{label: trace}`` (a panel each).
        hook: the hook point's name within a block.
        kind: ``"heatmap"`` (layer x step, one colour scale) or ``"lines"`` (a line per layer).
        row: the trace row drawn.
        title: figure title.

    Returns:
        A plotly ``Figure``.

    Example:
        >>> tr = lp.trace_generation(model, prompt, max_new_tokens=32, record="blocks.*.hook_resid_post")
        >>> fig = activation_norm_figure(tr)
    """
    if kind not in ("heatmap", "lines"):
        raise LensprobeError(f"kind must be 'heatmap' or 'lines', got {kind!r}.")
    named = dict(traces) if isinstance(traces, Mapping) else {"": traces}
    if not named:
        raise LensprobeError("no trace given: pass a trace or {label: trace}.")
    data = {label: _norms(tr, hook, row) for label, tr in named.items()}
    n = len(data)
    top = max((x for _, v in data.values() for steps in v for x in steps if x == x), default=1.0)
    n_layers = max(len(ls) for ls, _ in data.values())
    if kind == "heatmap":
        height = max(360, 170 + 16 * n_layers)
        fig = make_subplots(rows=1, cols=n, shared_yaxes=True, horizontal_spacing=0.04 if n > 1 else 0.0,
                            subplot_titles=list(data) if n > 1 else None)
        for i, (label, (layers, v)) in enumerate(data.items(), start=1):
            fig.add_trace(go.Heatmap(
                z=v, x=list(range(len(v[0]) if v else 0)), y=layers, zmin=0.0, zmax=top, colorscale="Viridis",
                showscale=i == n, colorbar=dict(title=dict(text="norm")), name=label,
                hovertemplate="layer %{y}, step %{x}<br>norm %{z:.4g}<extra></extra>"), row=1, col=i)
            fig.update_xaxes(title_text="generation step", row=1, col=i)
        fig.update_yaxes(title_text="layer (0-based)", autorange="reversed", row=1, col=1)
    else:
        height = 120 + 260 * n
        fig = make_subplots(rows=n, cols=1, shared_xaxes=True, vertical_spacing=vspacing(n, 40, height),
                            subplot_titles=list(data) if n > 1 else None)
        for i, (_, (layers, v)) in enumerate(data.items(), start=1):
            for j, layer in enumerate(layers):
                fig.add_trace(go.Scatter(
                    x=list(range(len(v[j]))), y=v[j], mode="lines", name=f"layer {layer}",
                    legendgroup=str(layer), showlegend=i == 1, line=dict(color=_layer_color(j, len(layers))),
                    hovertemplate=f"layer {layer}<br>step %{{x}}<br>norm %{{y:.4g}}<extra></extra>"), row=i, col=1)
            fig.update_yaxes(title_text="norm", row=i, col=1)
        fig.update_xaxes(title_text="generation step (0 = last prompt position)", row=n, col=1)
    head = title or f"Norm of blocks.L.{hook} per generation step"
    fig.update_layout(**header(f"{head}<br><sup>{INDEX_NOTE}; step 0 = last prompt position</sup>", height,
                               "" if kind == "heatmap" else "layer: "),
                      height=height, template="plotly_white", margin=dict(t=120, l=80, r=30, b=60))
    return fit_figure(fig)


def _layer_color(j: int, n: int) -> str:
    """Light to dark blue from the first layer to the last."""
    t = j / max(n - 1, 1)
    return f"rgb({int(198 - 190 * t)},{int(219 - 171 * t)},{int(239 - 132 * t)})"
