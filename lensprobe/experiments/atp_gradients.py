"""AtP's gradient pass for one prompt, with GradDrop's: the metric's gradient at every layer's ``hook_z``.

A *unit* is ``(layer, heads)``: one query head, or every query head of a KV group, ablated
together at ``blocks.{layer}.attn.hook_z`` exactly as :func:`~lensprobe.interventions.ablation.ablate_heads`
does (same positions, same replacement values). Its ablation changes ``z`` by ``dz``
(zero at positions that are not ablated). :func:`lensprobe.experiments.atp.attribute_prompt` combines this
pass with the QK fix (:mod:`lensprobe.experiments.atp_qkfix`).

1. **AtP** (one forward, one backward): the metric's gradient ``g_l = dM/dz_l`` is read at a
   zero leaf added to every layer's ``hook_z``; the estimate is ``sum(dz * g)``. No parameter
   receives a gradient: parameters are frozen for the pass (their ``requires_grad`` flags are
   restored afterwards, also on errors) and the gradients are taken with ``torch.autograd.grad``.
2. **GradDrop** (Kramar et al. 2024, sec. 3.1.2): for every layer ``L'``, the gradient is
   propagated with layer ``L'``'s residual contributions dropped: the gradient that reaches
   ``blocks.{L'}.hook_resid_pre`` is the one at its ``hook_resid_post`` (the skip connection
   only). One backward through the layers below ``L'`` each; the dropped gradients at every
   ``hook_z`` below ``L'`` are kept for the QK fix.
"""

from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import Hook, intervene
from lensprobe.core.hooks.heads import Positions, hook_z_name
from lensprobe.interventions.replacement import replacement_values

__all__ = ["GradientPass", "Unit", "delta_z", "frozen_parameters", "gradient_pass"]

Unit = tuple[int, tuple[int, ...]]
"""``(layer, query heads)`` ablated together."""


@contextmanager
def frozen_parameters(model):
    """Gradients on, every parameter's ``requires_grad`` off; both restored on exit (also on errors).

    Example:
        >>> with frozen_parameters(model):
        ...     logits = model(tokens)   # a graph only from leaves the caller adds
    """
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        with torch.inference_mode(False), torch.enable_grad():
            yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


# --------------------------------------------------------------------------- hooks


@dataclass(frozen=True)
class _ZTap:
    """Hook at ``hook_z``: keeps ``z`` and adds a zero leaf whose gradient is ``dM/dz``."""
    store: dict
    layer: int

    def __call__(self, z: Tensor, hook) -> Tensor:
        leaf = torch.zeros_like(z, requires_grad=True)
        self.store[self.layer] = (z.detach(), leaf)
        return z + leaf


@dataclass(frozen=True)
class _Keep:
    """Hook: keeps the activation itself (in the graph) under ``key``."""
    store: dict
    key: int

    def __call__(self, x: Tensor, hook) -> None:
        self.store[self.key] = x



# --------------------------------------------------------------------------- AtP and GradDrop


def delta_z(z: Tensor, layer: int, positions: Positions | None, source) -> Tensor:
    """``[pos, head, d_head]`` change of ``z`` when every head is ablated as ``ZAblationHook`` does."""
    n = z.shape[0]
    pos = torch.arange(n, device=z.device)[None]
    selected = torch.ones_like(pos, dtype=torch.bool) if positions is None else positions.select(pos)
    values = replacement_values(source, layer, pos, selected)
    target = torch.zeros_like(z) if values is None else values.to(z.device, z.dtype).expand(1, *z.shape)[0]
    return torch.where(selected[0].to(z.device)[:, None, None], target - z, 0.0).float()


def _dot(dz: Tensor, g: Tensor | None, heads: tuple[int, ...]) -> float:
    if g is None:
        return 0.0
    idx = list(heads)
    return float((dz[:, idx] * g[0][:, idx].float()).sum())


def _logits(model, tokens: Tensor, keep: int) -> Tensor:
    if keep > 0:
        try:
            return model(tokens, logits_to_keep=keep)
        except TypeError:  # a model without logits_to_keep
            pass
    return model(tokens)


def _metric(measure, model, prompt, tokens: Tensor, logits: Tensor) -> Tensor:
    value = measure.compute(logits, tokens, prompt, [])
    if not isinstance(value, Tensor) or value.numel() != 1 or not value.requires_grad:
        raise LensprobeError(
            f"the metric {getattr(measure, 'name', measure)!r} must give one value per prompt computed from the "
            "logits with torch operations (so it has a gradient); it returned "
            f"{tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__}."
        )
    if not bool(torch.isfinite(value).all()):
        raise LensprobeError(
            f"the metric is {float(value.detach())} on this prompt (not finite): attribution needs a finite metric; "
            "check the prompt and the model's logits."
        )
    return value.sum()


def _refuse_cut_gradient(g: Mapping[int, Tensor | None], units: Sequence[Unit], measure) -> None:
    """Refuse a metric whose gradient at every attributed head's output is zero: every estimate would be
    0 whatever the heads do (the exact sweep of the same metric is not)."""
    grads = [g.get(layer) for layer in {u[0] for u in units}]
    if all(x is None or not bool(x.any()) for x in grads):
        raise LensprobeError(
            f"the metric {getattr(measure, 'name', measure)!r} has a zero gradient at the output of every attributed "
            "head on this prompt: its computation cuts the gradient (.detach(), .item(), argmax, a Python number) "
            "or does not depend on these heads, so every estimate would be 0. Compute it from the logits with "
            "differentiable torch operations, or measure the heads exactly with lp.ablation_sweep."
        )


@dataclass
class GradientPass:
    """One forward and backward: per unit layer ``dz`` (``[pos, head, d_head]``), per layer the gradient ``g``
    at ``hook_z`` (``[1, pos, head, d_head]``; ``None`` where the metric does not depend on it), AtP per unit, GradDrop's terms
    (see :class:`lensprobe.experiments.atp.PromptAttribution`) and gradients: ``drops[D][L]``, the gradient at layer ``L``'s ``hook_z``
    with layer ``D``'s gradient dropped (``L < D``)."""
    dz: dict[int, Tensor]
    g: dict[int, Tensor]
    linear: Tensor
    dropped: Tensor | None
    drops: dict[int, dict[int, Tensor]]
    value: float


def _drop_gradients(pre: dict, leaves: list[Tensor], seeds: Sequence[Tensor | None],
                    first: int) -> dict[int, dict[int, Tensor]]:
    """GradDrop's backward passes, one per layer ``D`` above ``first`` (the lowest unit's layer): the
    gradient reaching ``blocks.{D}.hook_resid_pre`` is the one at its ``hook_resid_post``
    (``seeds[D - 1]``), pulled back to every ``hook_z`` from ``first`` up to ``D``."""
    drops: dict[int, dict[int, Tensor]] = {}
    for drop in range(first + 1, len(leaves)):
        seed = seeds[drop - 1]
        if seed is None:  # nothing above this layer reaches the metric: the dropped gradient is 0
            continue
        gd = torch.autograd.grad(pre[drop], leaves[:drop], grad_outputs=seed, retain_graph=True,
                                 allow_unused=True)
        drops[drop] = {layer: x for layer, x in enumerate(gd) if x is not None and layer >= first}
    return drops


def gradient_pass(model, tokens: Tensor, measure, prompt, units: Sequence[Unit], positions, source,
               grad_drop: bool) -> GradientPass:
    """One forward and backward: ``dz`` and ``g`` per layer, AtP per unit, GradDrop's gradients and terms."""
    n_layers = int(model.cfg.n_layers)
    zs: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> (z, gradient leaf)
    pre: dict[int, Tensor] = {}
    post: dict[int, Tensor] = {}
    hooks: list[Hook] = [(hook_z_name(layer), _ZTap(zs, layer)) for layer in range(n_layers)]
    if grad_drop:
        hooks += [(f"blocks.{layer}.hook_resid_pre", _Keep(pre, layer)) for layer in range(1, n_layers)]
        hooks += [(f"blocks.{layer}.hook_resid_post", _Keep(post, layer)) for layer in range(1, n_layers)]
    keep = getattr(measure, "logits_needed", lambda m, p: 0)(model, prompt)
    with frozen_parameters(model):
        with intervene(model, *hooks):
            logits = _logits(model, tokens, int(keep))
        value = _metric(measure, model, prompt, tokens, logits)
        leaves = [zs[layer][1] for layer in range(n_layers)]
        outs = [post[layer] for layer in range(1, n_layers)] if grad_drop else []
        grads = torch.autograd.grad(value, leaves + outs, retain_graph=grad_drop, allow_unused=True)
        g = dict(enumerate(grads[:n_layers]))
        _refuse_cut_gradient(g, units, measure)
        dz = {layer: delta_z(zs[layer][0][0], layer, positions, source) for layer in {u[0] for u in units}}
        linear = torch.tensor([_dot(dz[layer], g[layer], heads) for layer, heads in units], device="cpu")
        drops = _drop_gradients(pre, leaves, grads[n_layers:], min(u[0] for u in units)) if grad_drop else {}
    dropped = None
    if grad_drop:
        dropped = torch.full((n_layers, len(units)), float("nan"), device="cpu")
        for drop, at in drops.items():
            for i, (layer, heads) in enumerate(units):
                if layer < drop:
                    dropped[drop, i] = _dot(dz[layer], at.get(layer), heads)
    return GradientPass(dz, g, linear, dropped, drops, float(value.detach()))

