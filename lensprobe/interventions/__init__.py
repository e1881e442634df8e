"""Interventions on activations, the hook objects: head ablation (zero, mean, resample at
``hook_z``), the replacement values, and ARM (the meaningless-tokens paper's redistribution of a
gated MLP's activations). The runners that use them over many forwards (sweeps, patching,
attribution) are in :mod:`lensprobe.experiments`.

Small hook objects attached through :func:`lensprobe.core.hooks.attach.intervene`; weights are never
mutated.

May import: :mod:`lensprobe.core`.
"""

from lensprobe.core.boundary import guard_public
from lensprobe.core.hooks.attach import (
    ActivationRecorder,
    AttentionRecorder,
    Intervention,
    intervene,
    matching_hook_names,
)
from lensprobe.core.hooks.capabilities import Capabilities
from lensprobe.core.hooks.hookpoint import HookSite, StepContext
from lensprobe.core.storage.declared import declare
from lensprobe.interventions.ablation import HeadAblation, ablate_heads, ablate_kv_group
from lensprobe.interventions.arm import ARM, arm_redistribute
from lensprobe.interventions.replacement import HeadMeans, head_means

__all__ = ["ARM", "ActivationRecorder", "AttentionRecorder", "Capabilities", "HeadAblation", "HeadMeans", "HookSite",
           "Intervention", "StepContext", "ablate_heads", "ablate_kv_group", "arm_redistribute", "declare",
           "head_means", "intervene", "matching_hook_names"]

guard_public(globals())  # public functions raise one LensprobeError (lensprobe.core.boundary)
