"""The papers' analyses: filler tokens (attention received, filler vs a random sentence, token
classes, the attention a prompt segment receives per layer), the layer-0 mechanism (the affine
rescaling of attention by the filler, MLP activations moving away from zero), heads (attention on one
head over generation, ablation effects), latent thinking (the same prompts under several thinking
settings) and attention sinks and massive activations per condition. They compute and return tables and
results; figures and reports live in :mod:`lensprobe.viz` and :mod:`lensprobe.app`.

May import: :mod:`lensprobe.core`, :mod:`lensprobe.interventions`, :mod:`lensprobe.generation`.
"""

from lensprobe.core.boundary import guard_public
from lensprobe.studies.filler import (
    FillerSetup,
    attention_received_by_condition,
    condition_changes,
    heads_by_change,
)
from lensprobe.studies.filler_random import filler_vs_random
from lensprobe.studies.heads import AblationEffect, ablation_effect, head_attention_over_generation
from lensprobe.studies.mechanism import (
    ActivationStats,
    activation_stats,
    affine_fit_summary,
    filler_affine_fit,
    mechanism_prompts,
)
from lensprobe.studies.segments import segment_attention
from lensprobe.studies.sinks import AttentionSinks, attention_sinks
from lensprobe.studies.thinking import (
    THINKING_SETTINGS,
    compare_thinking,
    thinking_setting,
    with_thinking_token,
)
from lensprobe.studies.token_classes import ascii_grid, compare_token_class_attention

__all__ = ["THINKING_SETTINGS", "AblationEffect", "ActivationStats", "AttentionSinks", "FillerSetup", "ablation_effect",
           "activation_stats", "affine_fit_summary", "ascii_grid", "attention_received_by_condition", "attention_sinks",
           "compare_thinking", "compare_token_class_attention", "condition_changes", "filler_affine_fit",
           "filler_vs_random", "head_attention_over_generation", "heads_by_change", "mechanism_prompts",
           "segment_attention", "thinking_setting", "with_thinking_token"]

guard_public(globals())  # public functions raise one LensprobeError (lensprobe.core.boundary)
