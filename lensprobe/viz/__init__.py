"""Figures: plotly figures and circuitsvis views built from lensprobe's results.

Figure functions take results (DataFrames or result dataclasses), compute nothing and
never call ``.show()``. Layers and heads are labelled TransformerLens-style, 0-based
("L0H13" is the papers' "layer 1, head 14"). Colours and labels of conditions, token classes
and traces come from :mod:`lensprobe.viz.style`; :mod:`lensprobe.viz.report` writes the report
page; :func:`save` writes a figure as PDF, SVG, PNG (through kaleido and a Chrome/Chromium), HTML or
JSON. The package is imported on first use of ``lp.viz``, so its modules import plotly at the top.

May import: :mod:`lensprobe.core` (names, labels, JSON), :mod:`lensprobe.evals` (to read saved
result folders) and plotting libraries; never a study or the app.
"""

from lensprobe.core.boundary import guard_public
from lensprobe.viz.ablation import head_attention_figure, next_token_figure, patch_figure, sweep_heatmap
from lensprobe.viz.attention import (
    attention_received_figure,
    attention_view_html,
    condition_change_figure,
    filler_vs_random_figure,
    segment_attention_figure,
    token_class_figure,
)
from lensprobe.viz.attribution import (
    attribution_heatmap,
    attribution_scatter,
    find_heads_heatmap,
    find_heads_scatter,
)
from lensprobe.viz.eval_report import results_section, write_eval_report
from lensprobe.viz.evals import accuracy_bars, accuracy_by_level
from lensprobe.viz.export import save
from lensprobe.viz.lens import logit_lens
from lensprobe.viz.mechanism import activation_histogram_figure, affine_fit_figure
from lensprobe.viz.report import Section, write_report
from lensprobe.viz.sinks import (
    activation_norm_figure,
    massive_activation_figure,
    sink_heatmap,
    sink_steps_figure,
)
from lensprobe.viz.trace import generation_trace_figure

__all__ = [
    "Section",
    "results_section",
    "write_eval_report",
    "write_report",
    "save",
    "accuracy_bars",
    "accuracy_by_level",
    "activation_histogram_figure",
    "activation_norm_figure",
    "affine_fit_figure",
    "attention_received_figure",
    "attention_view_html",
    "attribution_heatmap",
    "attribution_scatter",
    "find_heads_heatmap",
    "find_heads_scatter",
    "condition_change_figure",
    "filler_vs_random_figure",
    "generation_trace_figure",
    "head_attention_figure",
    "logit_lens",
    "massive_activation_figure",
    "next_token_figure",
    "patch_figure",
    "segment_attention_figure",
    "sink_heatmap",
    "sink_steps_figure",
    "sweep_heatmap",
    "token_class_figure",
]

guard_public(globals())  # public functions raise one LensprobeError (lensprobe.core.boundary)
