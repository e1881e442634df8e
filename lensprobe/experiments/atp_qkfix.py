"""The QK fix of attribution patching for one prompt (Kramar et al. 2024, sec. 3.1.1): the attention of
the layers above an ablated head recomputed exactly, in batched local passes.

The paper defines it for query and key nodes: their attention
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import intervene
from lensprobe.core.hooks.heads import hook_z_name
from lensprobe.experiments.atp_gradients import GradientPass, Unit, frozen_parameters

__all__ = ["Plan", "Stack", "qk_corrections", "qk_passes"]


class _LocalDone(Exception):
    """Ends a local pass once its last layer is read."""


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


def _gradient_stack(grads: GradientPass, layer: int, n_layers: int) -> Stack:
    """The full gradient at ``layer``'s ``hook_z``, then one per GradDrop layer above it."""
    cols, rows = [0], [grads.g[layer][0].float()]  # targets are layers with a gradient
    for drop in range(layer + 1, n_layers):
        if drop in grads.drops:
            at = grads.drops[drop].get(layer)
            cols.append(drop)
            rows.append(torch.zeros_like(rows[0]) if at is None else at[0].float())
    return cols, torch.stack(rows)


def qk_passes(units: Sequence[Unit], n_layers: int, batch_size: int) -> int:
    """The forward passes the QK fix (``qk_corrections``) runs at most: one pulling gradients back, then
    one per chunk of ``batch_size`` units below the highest layer (fewer when upper layers have no
    gradient)."""
    below = sum(1 for u in units if u[0] < n_layers - 1)
    return 1 + -(-below // batch_size) if below else 0


def qk_corrections(model, tokens: Tensor, units: Sequence[Unit], grads: GradientPass, batch_size: int,
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

