"""lensprobe: attention, entropy and intervention studies on TransformerLens models.

``import lensprobe as lp`` gives everything the README and the tutorials use (listed in
``__all__``); the figures are in ``lp.viz``, imported on first use so that ``import
lensprobe`` loads no plotting library, and the evaluation statistics in ``lp.evals``.
The code is organised by role, data flowing one way (see the README): ``core`` ->
``interventions`` -> ``generation`` -> ``studies`` -> ``viz`` -> ``app``, with ``evals``
(conditions x problems -> graded rows) built on ``generation`` and read by ``viz`` and ``app``.

Example:
    >>> import lensprobe as lp
    >>> model = lp.load_model()
    >>> p = lp.build_prompt(model, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT,
    ...                     filler=lp.Filler.meaningless())
    >>> pats = lp.attention_patterns(model, p, layers=[0])
    >>> recv = lp.average_attention_received(pats[0])  # [head, key_pos]
"""

import importlib

from lensprobe import evals
from lensprobe.core.errors import LensprobeError, ModelLoadError
from lensprobe.core.hooks.attach import AttentionRecorder, Capabilities, Intervention, intervene
from lensprobe.core.hooks.forward import attention_patterns, forward
from lensprobe.core.measures.forced import ContinuationEntropy, ContinuationLogProb, LogitDiff
from lensprobe.core.measures.measure import AnswerLogProb, AttentionTo, Entropy, measure_once
from lensprobe.core.measures.metrics import (
    DEFAULT_TOKEN_CLASSES,
    attention_by_token_class,
    attention_proportion,
    average_attention_received,
    entropy,
)
from lensprobe.core.models.devices import default_device, hub_reachable
from lensprobe.core.models.loading import cache_dir, load_model, model_label
from lensprobe.core.prompts.conditions import PROMPT_FORMATS, Condition, paper_conditions, with_arm
from lensprobe.core.prompts.prompt import (
    MATH_SYSTEM_PROMPT,
    PAPER_SYSTEM_PROMPT,
    Filler,
    Prompt,
    build_prompt,
    prompt_json,
)
from lensprobe.core.version import __version__ as __version__
from lensprobe.evals import (
    EvalConfig,
    Problem,
    arithmetic_problems,
    evaluate,
    extract_boxed,
    extract_last_number,
    grade,
    load_math500,
    load_problems,
    load_results,
    math500_path,
)
from lensprobe.experiments.attribution import Attribution, attribute_heads
from lensprobe.experiments.patching import PatchResult, patch
from lensprobe.experiments.sweep import SweepResult, ablation_sweep
from lensprobe.experiments.verify import Verification, verify_attribution
from lensprobe.generation import (
    FinishedRow,
    GenerationConfig,
    HookSite,
    StepContext,
    generate,
    schedule,
    trace_generation,
)
from lensprobe.generation.thinking import LatentFusion, Pause, add_thinking_token
from lensprobe.generation.trace import GenerationTrace, load_trace, trace_summary
from lensprobe.generation.traceset import trace_prompts
from lensprobe.interventions.ablation import HeadAblation, ablate_heads, ablate_kv_group
from lensprobe.interventions.arm import ARM, arm_redistribute
from lensprobe.interventions.replacement import HeadMeans, head_means
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
from lensprobe.studies.mechanism import (
    ActivationStats,
    activation_stats,
    affine_fit_summary,
    filler_affine_fit,
    mechanism_prompts,
)
from lensprobe.studies.thinking import (
    THINKING_SETTINGS,
    compare_thinking,
    thinking_setting,
    with_thinking_token,
)

__all__ = [
    # models and prompts
    "load_model",
    "default_device",
    "hub_reachable",
    "cache_dir",
    "model_label",
    "Prompt",
    "build_prompt",
    "prompt_json",
    "Filler",
    "MATH_SYSTEM_PROMPT",
    "PAPER_SYSTEM_PROMPT",
    "Condition",
    "PROMPT_FORMATS",
    "paper_conditions",
    "with_arm",
    # forward passes, hooks and metrics
    "forward",
    "attention_patterns",
    "intervene",
    "Capabilities",
    "Intervention",
    "AttentionRecorder",
    "average_attention_received",
    "attention_proportion",
    "attention_by_token_class",
    "DEFAULT_TOKEN_CLASSES",
    "entropy",
    "Entropy",
    "AnswerLogProb",
    "AttentionTo",
    "LogitDiff",
    "ContinuationEntropy",
    "ContinuationLogProb",
    "measure_once",
    # interventions
    "ARM",
    "arm_redistribute",
    "ablate_heads",
    "ablate_kv_group",
    "HeadAblation",
    "head_means",
    "HeadMeans",
    "patch",
    "PatchResult",
    "ablation_sweep",
    "SweepResult",
    "attribute_heads",
    "Attribution",
    "verify_attribution",
    "Verification",
    # generation
    "generate",
    "trace_generation",
    "trace_prompts",
    "GenerationConfig",
    "GenerationTrace",
    "FinishedRow",
    "load_trace",
    "trace_summary",
    "HookSite",
    "StepContext",
    "schedule",
    "LatentFusion",
    "Pause",
    "add_thinking_token",
    # studies
    "attention_received",
    "FillerSetup",
    "condition_changes",
    "heads_by_change",
    "filler_vs_random",
    "token_class_attention",
    "ascii_grid",
    "head_attention_over_generation",
    "filler_affine_fit",
    "affine_fit_summary",
    "activation_stats",
    "ActivationStats",
    "mechanism_prompts",
    "ablation_effect",
    "AblationEffect",
    "compare_thinking",
    "thinking_setting",
    "THINKING_SETTINGS",
    "with_thinking_token",
    # evaluation
    "evaluate",
    "EvalConfig",
    "load_math500",
    "arithmetic_problems",
    "load_problems",
    "Problem",
    "math500_path",
    "load_results",
    "extract_boxed",
    "extract_last_number",
    "grade",
    # reproducing the papers (imported on first use: they draw figures)
    "reproduce",
    "list_recipes",
    "load_recipe",
    # subpackages (lensprobe.viz is imported on first use)
    "evals",
    "viz",
    # errors
    "LensprobeError",
    "ModelLoadError",
]

_LAZY_SUBMODULES = ("viz",)
_LAZY_FUNCTIONS = {"reproduce": "lensprobe.app.reproduce", "list_recipes": "lensprobe.app.recipe",
                   "load_recipe": "lensprobe.app.recipe"}


def __getattr__(name: str):
    """``lp.viz`` and ``lp.reproduce`` (with ``lp.list_recipes``, ``lp.load_recipe``): imported on
    first use (plotting stays out of ``import lensprobe``)."""
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"lensprobe.{name}")
    if name in _LAZY_FUNCTIONS:
        return getattr(importlib.import_module(_LAZY_FUNCTIONS[name]), name)
    raise AttributeError(f"module 'lensprobe' has no attribute {name!r}")
