"""The attribution-patching engine for one prompt: gradients at ``hook_z``, GradDrop, the QK fix.

:func:`lensprobe.attribute_heads` (in :mod:`lensprobe.experiments.attribution`) calls
:func:`attribute_prompt` once per prompt; this module holds the passes and their hooks.

A *unit* is ``(layer, heads)``: one query head, or every query head of a KV group, ablated
together at ``blocks.{layer}.attn.hook_z`` exactly as :func:`~lensprobe.interventions.ablation.ablate_heads`
does (same positions, same replacement values). Its ablation changes ``z`` by ``dz``
(zero at positions that are not ablated).

1. **AtP** (one forward, one backward): the metric's gradient ``g_l = dM/dz_l`` is read at a
   zero leaf added to every layer's ``hook_z``; the estimate is ``sum(dz * g)``. No parameter
   receives a gradient: parameters are frozen for the pass (their ``requires_grad`` flags are
   restored afterwards, also on errors) and the gradients are taken with ``torch.autograd.grad``.
2. **GradDrop** (Kramar et al. 2024, sec. 3.1.2): for every layer ``L'``, the gradient is
   propagated with layer ``L'``'s residual contributions dropped: the gradient that reaches
   ``blocks.{L'}.hook_resid_pre`` is the one at its ``hook_resid_post`` (the skip connection
   only). One backward through the layers below ``L'`` each; the dropped gradients at every
   ``hook_z`` below ``L'`` are kept for the QK fix.
3. **QK fix** (sec. 3.1.1). The paper defines it for query and key nodes: their attention
   logits are linear in them, so the softmax of their own head is computed exactly and only
   what follows the pattern is linearised. A head *output* (``hook_z``, what is ablated here)
   lies after its own softmax; the softmaxes it reaches are those of the later layers, whose
   queries and keys its write changes. So the fix is applied there: the unit's write into the
   residual stream, ``dz @ W_O``, is added to every later layer's attention input, where the
   attention is recomputed exactly (the model's own norm, queries, keys, softmax and values,
   batched over units), and the change of that layer's ``z`` is dotted with its gradient; this
   replaces the linear term of the same path, ``u . (dz @ W_O)`` with ``u = J^T g`` (a local
   gradient through that layer's attention only). The same is done with every GradDrop
   gradient, so AtP* is GradDrop applied to the QK-fixed estimate. Only the direct write is
   fixed: its effect through MLPs, and through one later layer into another, stays linear.
"""

from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import Hook, intervene
from lensprobe.core.hooks.heads import Positions, hook_z_name
from lensprobe.interventions.replacement import replacement_values

__all__ = ["PromptAttribution", "Unit", "attribute_prompt", "combine", "delta_z", "frozen_parameters"]

Unit = tuple[int, tuple[int, ...]]
"""``(layer, query heads)`` ablated together."""


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


class _LocalDone(Exception):
    """Ends a local pass once its last layer is read."""


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


@dataclass(frozen=True)
class _AddRows:
    """Hook at a layer's attention input (batch 1): ``[x, x + w_1, ...]``, or ``leaves`` copies of
    ``x`` as one gradient leaf (one row per gradient that is pulled back through the layer)."""
    writes: Callable[[], Tensor] | None
    state: dict
    leaves: int = 1

    def __call__(self, x: Tensor, hook) -> Tensor:
        if self.writes is None:
            leaf = x.detach().expand(self.leaves, *x.shape[1:]).clone().requires_grad_(True)
            self.state["leaf"] = leaf
            return leaf
        return torch.cat([x, x + self.writes().to(x.dtype)], dim=0)


@dataclass(frozen=True)
class _ReadZ:
    """Hook at ``hook_z`` of a local pass: reads the rows, then goes on with row 0 only (or stops)."""
    read: Callable[[Tensor], None]
    last: bool

    def __call__(self, z: Tensor, hook) -> Tensor:
        self.read(z)
        if self.last:
            raise _LocalDone
        return z[:1].detach()


def _first_row(x: Tensor, hook) -> Tensor:
    """Hook at ``hook_resid_post``: back to batch 1 after a layer whose attention input had rows."""
    return x[:1].detach()


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
class _Pass:
    """One forward and backward: per unit layer ``dz`` (``[pos, head, d_head]``), per layer the gradient ``g``
    at ``hook_z`` (``[1, pos, head, d_head]``; ``None`` where the metric does not depend on it), AtP per unit, GradDrop's terms
    (see :class:`PromptAttribution`) and gradients: ``drops[D][L]``, the gradient at layer ``L``'s ``hook_z``
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


def _gradients(model, tokens: Tensor, measure, prompt, units: Sequence[Unit], positions, source,
               grad_drop: bool) -> _Pass:
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
    return _Pass(dz, g, linear, dropped, drops, float(value.detach()))


# --------------------------------------------------------------------------- QK fix


def _input_hook(model, layer: int) -> tuple[str, bool]:
    """Where a layer's attention input can be given rows of its own, and whether the block must be
    brought back to batch 1 after it (when rows are added to the whole residual stream)."""
    name = f"blocks.{layer}.ln1.hook_in"
    if name in model.hook_dict:
        return name, False
    return f"blocks.{layer}.hook_resid_pre", True


Plan = dict[int, tuple[Callable[[], Tensor] | int, Callable[[Tensor, dict], None]]]
"""Per layer of a local pass: the rows' writes (an int ``k``: one gradient leaf of ``k`` rows) and the read
of its ``z``."""


def _local_pass(model, tokens: Tensor, plan: Plan) -> None:
    """One forward in which each planned layer's attention sees its rows (see :class:`_AddRows`); every
    other layer runs at batch 1, and the pass ends after the last planned layer."""
    last = max(plan)
    hooks = []
    for layer, (writes, read) in sorted(plan.items()):
        state: dict = {}
        name, back = _input_hook(model, layer)

        def read_rows(z: Tensor, r: Callable[[Tensor, dict], None] = read, s: dict = state) -> None:
            r(z, s)

        rows = _AddRows(None, state, writes) if isinstance(writes, int) else _AddRows(writes, state)
        hooks += [(name, rows), (hook_z_name(layer), _ReadZ(read_rows, layer == last))]
        if back and layer != last:
            hooks.append((f"blocks.{layer}.hook_resid_post", _first_row))
    with intervene(model, *hooks):
        try:
            model(tokens)
        except _LocalDone:
            pass


def _write(w_o: Tensor, dz: Tensor, heads: tuple[int, ...]) -> Tensor:
    """``[pos, d_model]``: what ablating ``heads`` changes in the residual stream (``dz @ W_O``)."""
    idx = list(heads)
    return torch.einsum("phd,hdm->pm", dz[:, idx], w_o[idx].float())


Stack = tuple[list[int], Tensor]
"""The gradients at a layer's ``hook_z`` that the QK fix dots with: their columns in the corrections
(0: the full gradient; ``D``: layer ``D``'s dropped) and the gradients ``[k, pos, head, d_head]``."""


def _gradient_stack(grads: _Pass, layer: int, n_layers: int) -> Stack:
    """The full gradient at ``layer``'s ``hook_z``, then one per GradDrop layer above it."""
    cols, rows = [0], [grads.g[layer][0].float()]  # targets are layers with a gradient
    for drop in range(layer + 1, n_layers):
        if drop in grads.drops:
            at = grads.drops[drop].get(layer)
            cols.append(drop)
            rows.append(torch.zeros_like(rows[0]) if at is None else at[0].float())
    return cols, torch.stack(rows)


def qk_passes(units: Sequence[Unit], n_layers: int, batch_size: int) -> int:
    """The forward passes the QK fix (``_qk_corrections``) runs at most: one pulling gradients back, then
    one per chunk of ``batch_size`` units below the highest layer (fewer when upper layers have no
    gradient)."""
    below = sum(1 for u in units if u[0] < n_layers - 1)
    return 1 + -(-below // batch_size) if below else 0


def _qk_corrections(model, tokens: Tensor, units: Sequence[Unit], grads: _Pass, batch_size: int,
                    tick: Callable[[], None] = lambda: None) -> Tensor:
    """``[unit, layer, drop]``: exact minus linear effect through each later layer's attention, with the full
    gradient (``drop = 0``) and with each GradDrop gradient (``drop = D``). ``tick`` is called after
    each forward pass."""
    n_layers = int(model.cfg.n_layers)
    corr = torch.zeros(len(units), n_layers, n_layers, device="cpu")
    targets = [layer for layer in range(1, n_layers)
               if grads.g.get(layer) is not None and any(u[0] < layer for u in units)]
    if not targets:
        return corr
    if [u[0] for u in units] != sorted(u[0] for u in units):
        raise LensprobeError("internal: attribution units must be in layer order.")
    w_o = {layer: model.blocks[layer].attn.W_O.detach() for layer in {u[0] for u in units}}
    stacks = {layer: _gradient_stack(grads, layer, n_layers) for layer in targets}
    local: dict[int, Tensor] = {}

    def read_local(layer: int) -> Callable[[Tensor, dict], None]:
        def read(z: Tensor, state: dict) -> None:
            total = (stacks[layer][1] * z.float()).sum()
            local[layer] = torch.autograd.grad(total, state["leaf"])[0].float()
        return read

    with frozen_parameters(model):  # u = J^T g per layer and gradient: one leaf row each, one pass
        _local_pass(model, tokens, {layer: (len(stacks[layer][0]), read_local(layer)) for layer in targets})
    tick()
    below = {layer: sum(1 for u in units if u[0] < layer) for layer in targets}  # units are in layer order
    with torch.inference_mode():
        for start in range(0, max(below.values()), batch_size):
            chunk = list(range(start, min(start + batch_size, max(below.values()))))
            writes = torch.stack([_write(w_o[units[i][0]], grads.dz[units[i][0]], units[i][1]) for i in chunk])
            plan: Plan = {layer: _exact_rows(layer, chunk[: below[layer] - start], writes, stacks[layer], local, corr)
                          for layer in targets if below[layer] > start}
            _local_pass(model, tokens, plan)
            tick()
    return corr


def _exact_rows(layer: int, chosen: list[int], writes: Tensor, stack: Stack, local: dict,
                corr: Tensor) -> tuple[Callable[[], Tensor], Callable[[Tensor, dict], None]]:
    """One layer of one chunk: the chosen units' writes as rows, and the read that fills ``corr``."""
    mine = writes[: len(chosen)]
    cols, grad = stack

    def read(z: Tensor, state: dict) -> None:
        z = z.float()
        exact = torch.einsum("kphd,uphd->uk", grad, z[1:] - z[:1])
        linear = torch.einsum("kpm,upm->uk", local[layer], mine)
        corr[torch.tensor(chosen)[:, None], layer, torch.tensor(cols)[None]] = (exact - linear).cpu()

    return (lambda: mine), read


# --------------------------------------------------------------------------- one prompt


def attribute_prompt(model, tokens: Tensor, measure, prompt, units: Sequence[Unit], positions: Positions | None,
                     source, *, qk_fix: bool, grad_drop: bool, batch_size: int,
                     tick: Callable[[], None] = lambda: None) -> PromptAttribution:
    """AtP for every unit on one prompt, with the QK fix's corrections and GradDrop's terms when asked.

    ``tokens`` are ``measure.inputs(model, prompt)``; ``positions`` and ``source`` are the
    ablation's resolved positions and replacement values (as a sweep uses them). ``tick`` is called
    after the gradient pass and after each of the QK fix's passes (a progress bar's step).
    """
    grads = _gradients(model, tokens, measure, prompt, units, positions, source, grad_drop)
    tick()
    n_layers = int(model.cfg.n_layers)
    corr = _qk_corrections(model, tokens, units, grads, batch_size, tick) if qk_fix else \
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
