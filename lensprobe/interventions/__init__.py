"""Interventions on activations: head ablation (zero, mean, resample at ``hook_z``), the
replacement values, activation patching aligned by segment, and batched ablation sweeps.

Small hook objects attached through :func:`lensprobe.core.hooks.intervene`; weights are never
mutated.

May import: :mod:`lensprobe.core`.
"""
