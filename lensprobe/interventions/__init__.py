"""Interventions on activations, the hook objects: head ablation (zero, mean, resample at
``hook_z``), the replacement values, and ARM (the meaningless-tokens paper's redistribution of a
gated MLP's activations). The runners that use them over many forwards (sweeps, patching,
attribution) are in :mod:`lensprobe.experiments`.

Small hook objects attached through :func:`lensprobe.core.hooks.attach.intervene`; weights are never
mutated.

May import: :mod:`lensprobe.core`.
"""

from lensprobe.interventions.arm import ARM, arm_redistribute

__all__ = ["ARM", "arm_redistribute"]
