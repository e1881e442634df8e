"""Figures: plotly figures and circuitsvis views built from lensprobe's results.

Figure functions take results (DataFrames or result dataclasses), compute nothing and
never call ``.show()``. Layers and heads are labelled TransformerLens-style, 0-based
("L0H13" is the papers' "layer 1, head 14").
"""

from lensprobe.viz.ablation import head_attention_figure, next_token_figure, patch_figure, sweep_heatmap
from lensprobe.viz.attention import (
    attention_received_figure,
    attention_view_html,
    condition_change_figure,
    filler_vs_random_figure,
    token_class_figure,
)
from lensprobe.viz.evals import accuracy_bars, accuracy_by_level
from lensprobe.viz.trace import generation_trace_figure

__all__ = [
    "accuracy_bars",
    "accuracy_by_level",
    "attention_received_figure",
    "attention_view_html",
    "condition_change_figure",
    "filler_vs_random_figure",
    "generation_trace_figure",
    "head_attention_figure",
    "next_token_figure",
    "patch_figure",
    "sweep_heatmap",
    "token_class_figure",
]
