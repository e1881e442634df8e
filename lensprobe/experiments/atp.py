"""The attribution-patching engine for one prompt: gradients at ``hook_z``, GradDrop, the QK fix.

:func:`lensprobe.attribute_heads` (in :mod:`lensprobe.experiments.attribution`) calls
:func:`attribute_prompt` once per prompt; this module holds the passes and their hooks.

A *unit* is ``(layer, heads)``: one query head, or every query head of a KV group, ablated
together at ``blocks.{layer}.attn.hook_z`` exactly as :func:`~lensprobe.interventions.ablation.ablate_heads`
does (same positions, same replacement values). Its ablation changes ``z`` by ``dz``
(zero at positions that are not ablated).

The passes live beside it: the gradient pass, AtP and GradDrop, in :mod:`lensprobe.experiments.atp_gradients`;
the QK fix in :mod:`lensprobe.experiments.atp_qkfix`. This module puts one prompt's parts together
(:class:`PromptAttribution`) and reads the estimate and the ranking score from them (:func:`combine`).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lensprobe.core.hooks.heads import Positions
from lensprobe.experiments.atp_gradients import Unit, gradient_pass
from lensprobe.experiments.atp_qkfix import qk_corrections

__all__ = ["PromptAttribution", "attribute_prompt", "combine"]


@dataclass
class PromptAttribution:
    """The parts of one prompt's attribution, per unit (see :func:`combine`).

    Attributes:
        linear: ``[unit]`` AtP, ``sum(dz * g)``.
        corrections: ``[unit, layer, drop]`` QK fix, exact minus linear through each later layer's
            attention: ``drop = 0`` with the full gradient, ``drop = D`` (a layer above the
            correction's) with layer ``D``'s gradient dropped (GradDrop; layer 0 is never above a
            correction's layer, so index 0 is free for the full gradient); zeros elsewhere and
            without the QK fix.
        dropped: ``[layer, unit]`` the AtP term with that layer's gradient dropped (GradDrop),
            ``NaN`` where it equals ``linear`` (layers at or below the unit's) or was not computed.
        value: the metric on the clean run.
    """

    linear: Tensor
    corrections: Tensor
    dropped: Tensor | None
    value: float



def attribute_prompt(model, tokens: Tensor, measure, prompt, units: Sequence[Unit], positions: Positions | None,
                     source, *, qk_fix: bool, grad_drop: bool, batch_size: int,
                     tick: Callable[[], None] = lambda: None) -> PromptAttribution:
    """AtP for every unit on one prompt, with the QK fix's corrections and GradDrop's terms when asked.

    ``tokens`` are ``measure.inputs(model, prompt)``; ``positions`` and ``source`` are the
    ablation's resolved positions and replacement values (as a sweep uses them). ``tick`` is called
    after the gradient pass and after each of the QK fix's passes (a progress bar's step).
    """
    grads = gradient_pass(model, tokens, measure, prompt, units, positions, source, grad_drop)
    tick()
    n_layers = int(model.cfg.n_layers)
    corr = qk_corrections(model, tokens, units, grads, batch_size, tick) if qk_fix else \
        torch.zeros(len(units), n_layers, n_layers, device="cpu")
    return PromptAttribution(grads.linear, corr, grads.dropped, grads.value)


def combine(part: PromptAttribution, units: Sequence[Unit], n_layers: int) -> tuple[Tensor, Tensor]:
    """``(estimate, score)`` per unit: the signed estimate (AtP plus the QK fix's corrections) and the
    magnitude that ranks units (GradDrop's when computed, else ``|estimate|``).

    GradDrop (Kramar et al. 2024, eq. for AtP+GD): ``score = sum_L' |c_L'| / (n_layers - 1)``
    where ``c_L'`` is the estimate with layer ``L'``'s gradient dropped: the estimate itself for
    ``L'`` below the unit's layer, 0 at the unit's own layer (its only way out is dropped), and
    above it the AtP term with the dropped gradient plus the QK corrections: those of the layers
    below ``L'`` computed with the dropped gradient, those above it with the full one (dropping
    ``L'`` does not change a gradient above it), none at ``L'`` itself.
    """
    estimate = part.linear + part.corrections[:, :, 0].sum(1)
    if part.dropped is None or n_layers < 2:
        return estimate, estimate.abs()
    score = torch.zeros(len(units), device="cpu")
    for i, (layer, _) in enumerate(units):
        for drop in range(n_layers):
            if drop < layer:
                score[i] += estimate[i].abs()
            elif drop > layer:
                kept = part.corrections[i, :drop, drop].sum() + part.corrections[i, drop + 1:, 0].sum()
                score[i] += (part.dropped[drop, i] + kept).abs()
    return estimate, score / (n_layers - 1)
