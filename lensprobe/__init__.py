"""lensprobe: attention, entropy and intervention studies on TransformerLens models.

Example:
    >>> import lensprobe as lp
    >>> model = lp.load_model()
    >>> p = lp.build_prompt(model, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT,
    ...                     filler=lp.Filler.meaningless())
    >>> pats = lp.attention_patterns(model, p, layers=[0])
    >>> recv = lp.average_attention_received(pats[0])  # [head, key_pos]
"""

from lensprobe.core.errors import LensprobeError, ModelLoadError
from lensprobe.core.forward import attention_patterns, forward
from lensprobe.core.hooks import AttentionRecorder, Intervention, intervene
from lensprobe.core.measures import AnswerLogProb, AttentionTo, Entropy, measure_once
from lensprobe.core.metrics import (
    DEFAULT_TOKEN_CLASSES,
    attention_by_token_class,
    attention_proportion,
    average_attention_received,
    entropy,
)
from lensprobe.core.models import cache_dir, load_model, model_label
from lensprobe.core.prompts import MATH_SYSTEM_PROMPT, Filler, Prompt, build_prompt, prompt_json
from lensprobe.evals import (
    Condition,
    EvalConfig,
    evaluate,
    extract_boxed,
    grade,
    load_math500,
    load_results,
    math500_path,
)
from lensprobe.generation import current_step, generate, schedule, trace_generation
from lensprobe.generation.thinking import LatentFusion, Pause, add_thinking_token
from lensprobe.generation.trace import GenerationTrace, load_trace, trace_summary
from lensprobe.interventions.ablation import HeadAblation, ablate_heads, ablate_kv_group
from lensprobe.interventions.patching import PatchResult, patch
from lensprobe.interventions.replacement import HeadMeans, head_means
from lensprobe.interventions.sweep import SweepResult, ablation_sweep
from lensprobe.studies.filler import (
    FillerSetup,
    ascii_grid,
    attention_received,
    condition_changes,
    filler_vs_random,
    heads_by_change,
    token_class_attention,
)
from lensprobe.studies.heads import AblationEffect, ablation_effect, head_attention_over_generation
from lensprobe.studies.thinking import (
    THINKING_SETTINGS,
    compare_thinking,
    thinking_setting,
    with_thinking_token,
)

__all__ = [
    "ascii_grid",
    "measure_once",
    "with_thinking_token",
    "thinking_setting",
    "compare_thinking",
    "THINKING_SETTINGS",
    "head_attention_over_generation",
    "ablation_effect",
    "AblationEffect",
    "math500_path",
    "prompt_json",
    "model_label",
    "DEFAULT_TOKEN_CLASSES",
    "MATH_SYSTEM_PROMPT",
    "AttentionRecorder",
    "Condition",
    "EvalConfig",
    "GenerationTrace",
    "LatentFusion",
    "Pause",
    "add_thinking_token",
    "current_step",
    "generate",
    "load_trace",
    "schedule",
    "trace_generation",
    "trace_summary",
    "Filler",
    "FillerSetup",
    "attention_received",
    "condition_changes",
    "filler_vs_random",
    "heads_by_change",
    "token_class_attention",
    "AnswerLogProb",
    "AttentionTo",
    "Entropy",
    "HeadAblation",
    "HeadMeans",
    "PatchResult",
    "SweepResult",
    "ablate_heads",
    "ablate_kv_group",
    "ablation_sweep",
    "head_means",
    "patch",
    "Intervention",
    "LensprobeError",
    "ModelLoadError",
    "Prompt",
    "attention_by_token_class",
    "attention_patterns",
    "attention_proportion",
    "average_attention_received",
    "build_prompt",
    "cache_dir",
    "entropy",
    "evaluate",
    "extract_boxed",
    "forward",
    "grade",
    "intervene",
    "load_math500",
    "load_model",
    "load_results",
]
__version__ = "0.1.0"

_LAZY_SUBMODULES = ("viz",)


def __getattr__(name: str):
    """``lp.viz``: imported on first use (plotting stays out of ``import lensprobe``)."""
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f"lensprobe.{name}")
    raise AttributeError(f"module 'lensprobe' has no attribute {name!r}")
