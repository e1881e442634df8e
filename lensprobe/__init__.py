"""lensprobe: attention, entropy and intervention studies on TransformerLens models.

``import lensprobe as lp`` gives what the README's examples use at the top level, and the rest in
namespaces by role: ``lp.models``, ``lp.prompts``, ``lp.interventions`` (hook objects, ``intervene``,
capabilities), ``lp.metrics`` (metrics and measures), ``lp.generation`` (KV-cached generation and
traces), ``lp.experiments`` (sweeps, patching, attribution), ``lp.studies`` (the papers' analyses),
``lp.evals`` (graded evaluations and statistics) and ``lp.viz`` (figures, imported on first use so that
``import lensprobe`` loads no plotting library).

One public path per object: everything public lives in exactly one namespace (``Condition`` in
``lp.prompts``, ``HookSite`` and ``StepContext`` in ``lp.interventions``). The top level adds a curated
set of shortcuts, each the very object of its namespace path (``lp.Condition is lp.prompts.Condition``),
and a few names that live only there (``lp.forward``, ``lp.attention_patterns``, the errors).
``dir(lensprobe)`` lists exactly these public names; the packages behind them (``lensprobe.core``,
``lensprobe.app``) are implementation, importable by their full names.

Example:
    >>> import lensprobe as lp
    >>> model = lp.load_model()
    >>> p = lp.build_prompt(model, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT,
    ...                     filler=lp.Filler.meaningless())
    >>> pats = lp.attention_patterns(model, p, layers=[0])
    >>> recv = lp.metrics.average_attention_received(pats[0])  # [head, key_pos]
"""

from lensprobe import evals, experiments, generation, interventions, metrics, models, prompts, studies
from lensprobe.core.boundary import guard_public, public_function
from lensprobe.core.errors import LensprobeError, LensprobeWarning
from lensprobe.core.hooks.attach import intervene
from lensprobe.core.hooks.forward import attention_patterns, forward
from lensprobe.core.models.loading import load_model, model_label
from lensprobe.core.prompts.conditions import Condition
from lensprobe.core.prompts.prompt import (
    MATH_SYSTEM_PROMPT,
    PAPER_SYSTEM_PROMPT,
    Filler,
    Prompt,
    build_prompt,
)
from lensprobe.core.version import __version__ as __version__
from lensprobe.evals import EvalConfig, evaluate, grade, load_math500
from lensprobe.experiments import (
    ablation_sweep,
    attribute_heads,
    find_heads,
    patch,
    patch_heads,
    verify_attribution,
)
from lensprobe.generation import GenerationConfig, Record, generate, trace_generation
from lensprobe.interventions import ARM, ablate_heads

__all__ = [
    # models and prompts
    "load_model",
    "model_label",
    "build_prompt",
    "Prompt",
    "Filler",
    "MATH_SYSTEM_PROMPT",
    "PAPER_SYSTEM_PROMPT",
    "Condition",
    # forward passes and interventions
    "forward",
    "attention_patterns",
    "intervene",
    "ablate_heads",
    "ARM",
    # generation
    "generate",
    "trace_generation",
    "GenerationConfig",
    "Record",
    # experiments
    "ablation_sweep",
    "patch",
    "patch_heads",
    "attribute_heads",
    "verify_attribution",
    "find_heads",
    # evaluations
    "evaluate",
    "EvalConfig",
    "load_math500",
    "grade",
    # reproducing the papers (imported on first use: they draw figures)
    "reproduce",
    "list_recipes",
    "load_recipe",
    # namespaces by role (lensprobe.viz is imported on first use)
    "models",
    "prompts",
    "interventions",
    "metrics",
    "generation",
    "experiments",
    "studies",
    "evals",
    "viz",
    # errors and warnings
    "LensprobeError",
    "LensprobeWarning",
]

guard_public(globals())  # public functions raise one LensprobeError (lensprobe.core.boundary)

_LAZY_SUBMODULES = ("viz",)
_LAZY_FUNCTIONS = {"reproduce": "lensprobe.app.reproduce", "list_recipes": "lensprobe.app.recipe",
                   "load_recipe": "lensprobe.app.recipe"}


def __getattr__(name: str):
    """``lp.viz`` and ``lp.reproduce`` (with ``lp.list_recipes``, ``lp.load_recipe``): imported on
    first use (plotting stays out of ``import lensprobe``)."""
    from importlib import import_module  # imported here: no helper module is a public name of lensprobe

    if name in _LAZY_SUBMODULES:
        return import_module(f"lensprobe.{name}")
    if name in _LAZY_FUNCTIONS:
        return public_function(getattr(import_module(_LAZY_FUNCTIONS[name]), name), f"lp.{name}")
    raise AttributeError(f"module 'lensprobe' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names (``__all__`` and ``__version__``); the internal packages (``lensprobe.core``,
    ``lensprobe.app``) stay importable by their full names but are not listed."""
    return sorted([*__all__, "__version__"])
