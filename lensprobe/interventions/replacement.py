"""What replaces an ablated head's output: zeros, its mean over reference prompts, or its
output on another prompt (resampling).

Example:
    >>> means = head_means(model, [p1, p2, p3])           # [head, d_head] per layer
    >>> lp.ablate_heads("L0H3", method="mean", reference=means)
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import ActivationRecorder
from lensprobe.core.hooks.forward import as_prompts, as_tokens, forward
from lensprobe.core.hooks.heads import hook_z_name
from lensprobe.core.models.loading import check_layers

__all__ = ["METHODS", "HeadMeans", "Method", "ablation_source", "check_method", "head_means", "record_z",
           "replacement_source", "replacement_values"]

Method = Literal["zero", "mean", "resample"]
METHODS = ("zero", "mean", "resample")


@dataclass(frozen=True)
class HeadMeans:
    """Mean ``hook_z`` per layer over a reference prompt set.

    ``values[layer]`` is ``[head, d_head]`` (averaged over every position of every prompt)
    or, with ``per_position=True``, ``[pos, head, d_head]`` (averaged over the prompts that
    reach each position; ``counts[pos]`` says how many).
    """

    values: dict[int, Tensor]
    per_position: bool
    n_prompts: int
    counts: Tensor | None = None

    def at(self, layer: int, pos: Tensor | None, selected: Tensor) -> Tensor:
        """Mean values for absolute positions ``pos`` ``[rows, count]``, broadcastable to ``hook_z``."""
        v = self.values.get(layer)
        if v is None:
            raise LensprobeError(f"these head means hold no values for layer {layer}; compute them for it.")
        if not self.per_position:
            return v
        return _take_positions(v, pos, selected, what="per-position mean reference")


def _take_positions(v: Tensor, pos: Tensor | None, selected: Tensor, *, what: str) -> Tensor:
    """``v[pos]`` (``[rows, count, ...]``) with a clear error when a selected position is past ``v``."""
    if pos is None:  # a position-independent hook (no offset) never reads per-position values
        raise LensprobeError(f"the {what} is per position but this hook does not know its absolute positions.")
    n = v.shape[0]
    pos = pos.to(v.device)
    chosen = pos[selected.to(v.device) & (pos >= 0)]
    if chosen.numel() and int(chosen.max()) >= n:
        raise LensprobeError(
            f"position {int(chosen.max())} is ablated but the {what} has only {n} positions (0-{n - 1}): "
            "use a longer reference, restrict positions=..., or use per_position=False."
        )
    return v[pos.clamp(min=0, max=n - 1)]


def record_z(model, tokens, layers: Sequence[int]) -> dict[int, Float[Tensor, "batch pos head_index d_head"]]:
    """``hook_z`` of the given layers for one forward pass (nothing else is kept)."""
    layers = check_layers(model, list(layers))
    rec = ActivationRecorder([hook_z_name(layer) for layer in layers])
    last = max(layers) + 1 if layers else 1
    forward(model, tokens, rec, stop_at_layer=last if last < model.cfg.n_layers else None)
    return {layer: rec.acts[hook_z_name(layer)] for layer in layers}


def head_means(model, reference, *, layers: Sequence[int] | None = None,
               per_position: bool = False) -> HeadMeans:
    """Mean of each head's output (``hook_z``) over a reference prompt set.

    Args:
        model: a TransformerLens model.
        reference: a prompt, token ids, or a list of them (different lengths are fine).
        layers: layers to compute (default: all).
        per_position: ``False`` averages over every position of every prompt (``[head,
            d_head]``); ``True`` averages over prompts at each absolute position
            (``[pos, head, d_head]``).

    Example:
        >>> means = head_means(model, [p1, p2, p3])
        >>> with lp.intervene(model, lp.ablate_heads("L0H3", method="mean", reference=means)):
        ...     logits = model(p.tokens)
    """
    layers = check_layers(model, None if layers is None else list(layers))
    items = [as_tokens(model, p) for p in as_prompts(model, reference)]  # [1, pos] each
    longest = max(t.shape[1] for t in items)
    sums: dict[int, Tensor] = {}
    counts = torch.zeros(longest, dtype=torch.float64, device="cpu")
    for tokens in items:
        n = tokens.shape[1]
        counts[:n] += 1
        for layer, z in record_z(model, tokens, layers).items():
            z = z[0].double()  # [pos, head, d_head]
            if layer not in sums:
                shape = (longest, *z.shape[1:]) if per_position else z.shape[1:]
                sums[layer] = torch.zeros(shape, dtype=torch.float64, device=z.device)
            if per_position:
                sums[layer][:n] += z
            else:
                sums[layer] += z.sum(0)
    if per_position:
        values = {lay: (s / counts.to(s.device)[:, None, None]).float() for lay, s in sums.items()}
        return HeadMeans(values, True, len(items), counts=counts)
    total = float(counts.sum())
    return HeadMeans({lay: (s / total).float() for lay, s in sums.items()}, False, len(items))


def replacement_source(model, method: str, reference, layers: list[int], per_position: bool):
    """What replaces the ablated slices: None (zero), HeadMeans (mean) or {layer: z} (resample)."""
    if method == "zero" or not layers:
        return None
    if method == "mean":
        if isinstance(reference, HeadMeans):
            missing = [layer for layer in layers if layer not in reference.values]
            if missing:
                raise LensprobeError(f"the given head means lack layers {missing}; compute them for those layers.")
            return reference
        return head_means(model, reference, layers=layers, per_position=per_position)
    items = [as_tokens(model, p) for p in as_prompts(model, reference)]  # [1, pos] each
    if len(items) != 1:
        raise LensprobeError(
            f"resample ablation takes its values from one reference prompt, got {len(items)}; "
            "pass a single prompt (use method='mean' to average over several)."
        )
    z = record_z(model, items[0], layers)
    return {layer: z[layer][0] for layer in layers}  # [pos, head, d_head]


def replacement_values(source, layer: int, pos: Tensor | None, selected: Tensor) -> Tensor | None:
    """Replacement values broadcastable to ``[batch, count, head, d_head]`` (None = zeros)."""
    if source is None:
        return None
    if isinstance(source, HeadMeans):
        return source.at(layer, pos, selected)
    return _take_positions(source[layer], pos, selected, what="resample reference prompt")


def check_method(method: str, reference) -> None:
    """Refuse an unknown method, or a reference that does not fit it (mean and resample need one, zero none)."""
    if method not in METHODS:
        raise LensprobeError(f"unknown ablation method {method!r}: use one of {METHODS}.")
    if method == "mean" and reference is None:
        raise LensprobeError(
            "method='mean' needs reference=...: a set of prompts to average each head's output "
            "over (or lp.interventions.head_means(model, prompts)). Use method='zero' for no reference."
        )
    if method == "resample" and reference is None:
        raise LensprobeError(
            "method='resample' needs reference=...: the prompt whose head outputs replace the ablated ones."
        )
    if method == "zero" and reference is not None:
        raise LensprobeError("method='zero' takes no reference; use method='mean' or 'resample' to use one.")


def ablation_source(model, method: Method, reference, layers: Sequence[int], per_position: bool = False):
    """Reference values for ``method`` over ``layers`` (``None`` for zero ablation)."""
    check_method(method, reference)
    return replacement_source(model, method, reference, sorted(set(layers)), per_position)
