"""Evaluation figures: accuracy bars per model x condition, and accuracy per difficulty level.

Both take the tables of :func:`lensprobe.evals.results.stats.accuracy` (columns ``accuracy``,
``low``, ``high``, ``n`` plus the grouping columns) and draw them as they are.
"""

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lensprobe.viz.fit import fit_figure
from lensprobe.viz.style import condition_colors, unique


def _error(rows):
    """Asymmetric error bars (percent) from the ``low``/``high`` interval columns."""
    acc = rows["accuracy"] * 100
    return dict(type="data", symmetric=False, array=(rows["high"] * 100 - acc).tolist(),
                arrayminus=(acc - rows["low"] * 100).tolist(), thickness=1.2, width=4)


def accuracy_bars(table, *, title: str | None = None, model_column: str = "model"):
    """The paper's grouped bars: accuracy (%) per model, one bar per condition, 95% interval error bars.

    Args:
        table: ``accuracy(rows, ["model", "condition"])`` (or ``accuracy(rows, "condition")``
            for a single model).
        title: figure title.
        model_column: column holding the model name.

    Example:
        >>> fig = accuracy_bars(lp.evals.accuracy(rows, ["model", "condition"]))
    """
    models = unique(table[model_column]) if model_column in table.columns else [""]
    conditions = unique(table["condition"])
    colors = condition_colors(conditions)
    grader = table["grader"].iloc[0] if "grader" in table.columns and len(table) else "math-verify"
    fig = go.Figure()
    for cond in conditions:
        rows = table[table["condition"] == cond]
        x = rows[model_column].tolist() if model_column in table.columns else [""] * len(rows)
        fig.add_trace(go.Bar(
            name=cond, x=x, y=(rows["accuracy"] * 100).tolist(), marker_color=colors[cond],
            error_y=_error(rows), customdata=list(zip(rows["correct"], rows["n"], strict=True)),
            text=[f"{a:.1f}" for a in rows["accuracy"] * 100], textposition="outside",
            hovertemplate=f"{cond}<br>%{{x}}: %{{y:.1f}}% (%{{customdata[0]}}/%{{customdata[1]}})<extra></extra>",
        ))
    fig.update_layout(
        barmode="group", template="plotly_white", height=420,
        title=title or "Accuracy per model and condition",
        yaxis_title=f"accuracy (%), {grader} grader; bars: 95% Wilson interval",
        xaxis_title="model" if len(models) > 1 or models[0] else None,
        legend_title="condition",
    )
    fig.update_yaxes(rangemode="tozero")
    return fit_figure(fig)


def accuracy_by_level(table, *, title: str | None = None, model_column: str = "model",
                      level_title: str = "difficulty level"):
    """Accuracy (%) per difficulty level, one line per condition (one panel per model), 95% intervals.

    Args:
        table: ``accuracy(rows, ["condition", "level"])`` or with ``"model"`` too.
        title: figure title.
        level_title: the x axis title (what a level is in this problem set).

    Example:
        >>> fig = accuracy_by_level(lp.evals.accuracy(rows, ["condition", "level"]))
    """
    models = unique(table[model_column]) if model_column in table.columns else [None]
    conditions = unique(table["condition"])
    colors = condition_colors(conditions)
    grader = table["grader"].iloc[0] if "grader" in table.columns and len(table) else "math-verify"
    fig = make_subplots(rows=1, cols=len(models), shared_yaxes=True,
                        subplot_titles=[str(m) for m in models] if models[0] is not None else None)
    for col, model in enumerate(models, start=1):
        part = table if model is None else table[table[model_column] == model]
        for cond in conditions:
            rows = part[part["condition"] == cond].sort_values("level")
            if rows.empty:
                continue
            fig.add_trace(go.Scatter(
                name=cond, legendgroup=cond, showlegend=col == 1, x=rows["level"].tolist(),
                y=(rows["accuracy"] * 100).tolist(), mode="lines+markers", marker_color=colors[cond],
                error_y=_error(rows), customdata=list(zip(rows["correct"], rows["n"], strict=True)),
                hovertemplate=f"{cond}<br>level %{{x}}: %{{y:.1f}}% (%{{customdata[0]}}/%{{customdata[1]}})"
                              "<extra></extra>",
            ), row=1, col=col)
        fig.update_xaxes(title_text=level_title, dtick=1, row=1, col=col)
    fig.update_yaxes(title_text=f"accuracy (%), {grader} grader", rangemode="tozero", row=1, col=1)
    fig.update_layout(template="plotly_white", height=420, legend_title="condition",
                      title=title or "Accuracy per difficulty level (bars: 95% Wilson interval)")
    return fit_figure(fig)
