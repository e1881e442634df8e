"""Batch-invariant decode steps: the first layers of a plain view computed one row at a time.

Continuous batching gives each row what it gives alone up to float rounding: a decode step
over several rows multiplies each weight by a ``[rows, d]`` matrix where a row alone uses a
``[1, d]`` vector (another kernel, other sums: about 1e-7 relative), and attends over a cache
left-padded to the longest row. Most results never notice. An intervention that thresholds
or ranks activations (ARM: which entries count as near zero, which draw each gets) can turn
such a difference into another token. Such an intervention names the last layer it reads
(its ``rounding_sensitive_layer`` capability, see :class:`lensprobe.core.hooks.attach.Intervention`),
and :func:`rows_alone` then makes every decode step compute layers ``0..that layer`` row by
row, as the row alone computes them:

- each linear layer multiplies one row at a time (the ``[1, d]`` product a row alone runs);
- attention takes one row at a time over that row's own keys (the cache's padding cut out,
  so the keys are the ones the row alone has), through the view's own attention function.

A row alone goes through the same code (one row, nothing to cut), so its numbers are equal
bit for bit. Prompt forwards are unchanged (under continuous batching each prompt runs alone
anyway). The cost is one weight read per row in those layers: on SmolLM2-135M with ARM on
layer 0, 1 of 30 layers.
"""

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from lensprobe.core.lazy import heavy
from lensprobe.generation.engines.view import attention_modules, mlp_modules

__all__ = ["ROWS_PREFIX", "rows_alone"]

ROWS_PREFIX = "lensprobe_rows_"
"""A view's attention implementation ``X`` runs as ``lensprobe_rows_X`` while :func:`rows_alone` is open."""

_ROW_MODULES: "set[int]" = set()  # ids of the attention modules computed row by row


@contextlib.contextmanager
def rows_alone(model, view: nn.Module, last_layer: int | None) -> Iterator[None]:
    """While open, decode steps of ``view`` (the plain view of ``model``) compute layers
    ``0..last_layer`` one row at a time. ``None``: nothing changes. Everything is restored on
    exit, also after an exception.
    """
    if last_layer is None:
        yield
        return
    attention, mlp = attention_modules(model, view), mlp_modules(model, view)
    layers = [layer for layer in attention if layer <= last_layer]
    linears = [m for layer in layers for part in (attention[layer], mlp[layer])
               for m in part.modules() if isinstance(m, nn.Linear)]
    config: Any = view.config  # an HF config (torch types module attributes Tensor | Module)
    before = config._attn_implementation
    modules = {id(attention[layer]) for layer in layers}
    own = {id(m): vars(m)["forward"] for m in linears if "forward" in vars(m)}  # e.g. accelerate's hooks
    try:
        config._attn_implementation = _register(before)
        _ROW_MODULES.update(modules)
        for m in linears:
            m.forward = _linear_rows(m.forward)  # type: ignore[method-assign]  # an instance attribute, restored on exit
        yield
    finally:
        for m in linears:
            if id(m) in own:
                m.forward = own[id(m)]  # type: ignore[method-assign]
            else:
                vars(m).pop("forward", None)
        _ROW_MODULES.difference_update(modules)
        config._attn_implementation = before


def _linear_rows(linear):
    """``linear`` (a linear layer's forward) applied one row at a time to one-position inputs."""
    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 3 or x.shape[1] != 1 or x.shape[0] == 1:
            return linear(x)
        return torch.cat([linear(x[r:r + 1].clone()) for r in range(x.shape[0])])
    return forward


def _register(implementation: str) -> str:
    """Register (once) the row-by-row attention over ``implementation``; return its name."""
    name = ROWS_PREFIX + implementation
    attention_functions = heavy("transformers.modeling_utils").ALL_ATTENTION_FUNCTIONS
    if name not in attention_functions:
        masks = heavy("transformers.masking_utils").ALL_MASK_ATTENTION_FUNCTIONS
        masks.register(name, masks[implementation])
        attention_functions.register(name, _rows_attention(implementation))
    return name


def _inner(module: nn.Module, implementation: str):
    """The attention function ``implementation`` names for ``module`` (eager: its model file's own)."""
    if implementation == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return heavy("transformers.modeling_utils").ALL_ATTENTION_FUNCTIONS[implementation]


def _rows_attention(implementation: str):
    def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, **kwargs):
        inner = _inner(module, implementation)
        if id(module) not in _ROW_MODULES or query.shape[2] != 1:
            return inner(module, query, key, value, attention_mask, **kwargs)
        outs, rows = [], []
        for r in range(query.shape[0]):
            keep = _kept_keys(attention_mask, r, key.shape[2])
            k, v = (key[r:r + 1], value[r:r + 1]) if keep is None else (key[r:r + 1, :, keep], value[r:r + 1, :, keep])
            out, weights = inner(module, query[r:r + 1], k.clone(), v.clone(), None, **kwargs)
            outs.append(out)
            rows.append((keep, weights))
        return torch.cat(outs), _weights(rows, query, key.shape[2])
    return attention


def _kept_keys(mask: torch.Tensor | None, row: int, width: int) -> torch.Tensor | None:
    """Row ``row``'s attended key positions (``None``: every key) from a boolean or additive mask."""
    if mask is None:
        return None
    last = mask[row, 0, -1, :width]
    keep = last if last.dtype == torch.bool else last == 0
    return None if bool(keep.all()) else keep.nonzero().flatten()


def _weights(rows: list, query: torch.Tensor, width: int) -> torch.Tensor | None:
    """Per-row attention weights placed back at their key positions, ``[batch, head, 1, key]``."""
    if any(w is None for _, w in rows):
        return None
    full = query.new_zeros(query.shape[0], query.shape[1], 1, width, dtype=rows[0][1].dtype)
    for r, (keep, w) in enumerate(rows):
        if keep is None:
            full[r] = w[0]
        else:
            full[r, :, :, keep] = w[0]
    return full
