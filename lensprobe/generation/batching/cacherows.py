"""Rows of a KV cache: keep some, drop leading padding columns, join another cache's rows.

Continuous batching (:mod:`lensprobe.generation.run`) takes finished rows out of the running
batch and puts newly prefilled jobs in. Every row of a cache is left-padded to the cache's
width (its columns), and the loop's attention mask marks the padding, so rows of different
lengths share one cache; position ids are passed per row, so padding never shifts a row's
positions. Two kinds of cache are handled:

- ``transformers``' ``DynamicCache`` whose layers are ``DynamicLayer`` (full attention: the
  TransformerBridge and the plain view), keys and values ``[row, kv_head, pos, d_head]``, or
  ``DynamicSlidingWindowLayer`` (Gemma's sliding-window layers), which keeps only the last
  ``sliding_window - 1`` of its ``cumulative_length`` columns: it is trimmed and joined as the
  columns it keeps of the same padded rows;
- TransformerLens' ``TransformerLensKeyValueCache`` (a 3.x ``HookedTransformer``), keys and
  values ``[row, pos, kv_head, d_head]`` plus the attention mask it keeps, ``[row, pos]``.

Any other cache (quantized, static, linear-attention layers) is reported by
:func:`can_join`, and the loop runs static batches instead.

Example:
    >>> keep_rows(cache, torch.tensor([0, 2]))  # rows 0 and 2 go on
    >>> drop_columns(cache, 3)                  # their first 3 columns were padding
    >>> cache = join(cache, solo_cache)          # a newly prefilled job joins as the last row
"""

from typing import Any

import torch
from torch import Tensor

__all__ = ["can_join", "drop_columns", "join", "keep_rows", "width"]


def _parts(cache) -> list[tuple[Any, str, int]]:
    """``(holder, attribute, position axis)`` of every tensor with one row per batch row."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer, name, 2) for layer in layers for name in ("keys", "values")]
    entries = getattr(cache, "entries", None)
    if entries is not None:
        return [(e, name, 1) for e in entries for name in ("past_keys", "past_values")] + [
            (cache, "previous_attention_mask", 1)]
    raise TypeError(f"not a KV cache lensprobe can batch: {type(cache).__name__}")


def _sliding(holder) -> bool:
    """Whether ``holder`` is a sliding-window cache layer (it keeps its last ``sliding_window - 1`` columns)."""
    return type(holder).__name__ == "DynamicSlidingWindowLayer"


def _columns(holder, name: str, axis: int) -> int:
    """Columns of the padded rows a part stands for (a sliding-window layer keeps only the last of them)."""
    return int(holder.cumulative_length) if _sliding(holder) else int(getattr(holder, name).shape[axis])


def _kept(holder, columns: int) -> int:
    """How many of ``columns`` the part keeps."""
    return min(columns, int(holder.sliding_window) - 1) if _sliding(holder) else columns


def can_join(cache) -> bool:
    """Whether rows of ``cache`` can be kept, trimmed and joined (see the module docstring)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return bool(layers) and all(
            getattr(layer, "is_initialized", True) and (type(layer).__name__ == "DynamicLayer" or (
                _sliding(layer) and not getattr(layer, "record_past", False)))
            for layer in layers)
    return type(cache).__name__ in ("TransformerLensKeyValueCache", "HookedTransformerKeyValueCache") and \
        not getattr(cache, "frozen", False)


def width(cache) -> int:
    """Columns (cached positions, padding included) of every row."""
    parts = _parts(cache)
    if not parts:
        raise TypeError(f"the {type(cache).__name__} holds no layers")
    return _columns(*parts[0])


def keep_rows(cache, rows: Tensor) -> None:
    """Keep only ``rows`` (indices, in the order given), in place (all or nothing: every new
    tensor is made before any is stored)."""
    parts = _parts(cache)
    kept = [getattr(h, n).index_select(0, rows.to(getattr(h, n).device)) for h, n, _ in parts]
    for (holder, name, _), t in zip(parts, kept, strict=True):
        setattr(holder, name, t)


def drop_columns(cache, n: int) -> None:
    """Drop the first ``n`` columns of every row (padding every row has), in place."""
    if n <= 0:
        return
    parts = _parts(cache)
    kept = [_kept(holder, _columns(holder, name, axis) - n) for holder, name, axis in parts]
    for (holder, name, axis), keep in zip(parts, kept, strict=True):
        t = getattr(holder, name)
        setattr(holder, name, t.narrow(axis, t.shape[axis] - keep, keep))
    for holder in {id(h): h for h, _, _ in parts if _sliding(h)}.values():
        holder.cumulative_length -= n


def join(running, new):
    """``running``'s rows followed by ``new``'s, both left-padded with zeros to the wider width.

    ``running`` may be ``None`` (no rows yet): ``new`` is returned. Otherwise ``running`` is
    changed in place and returned; if making the joined tensors fails (out of memory),
    ``running`` is left as it was.
    """
    if running is None:
        return new
    mine, theirs = _parts(running), _parts(new)
    if type(running) is not type(new) or len(mine) != len(theirs):
        raise ValueError(f"cannot join a {type(new).__name__} of {len(theirs)} tensors to a "
                         f"{type(running).__name__} of {len(mine)}: the caches come from different models")
    w = max(width(running), width(new))
    joined = []
    for (holder, name, axis), (other, other_name, _) in zip(mine, theirs, strict=True):
        a, b = getattr(holder, name), getattr(other, other_name)
        keep = _kept(holder, w)  # a row's padding columns in front of what a sliding-window layer keeps
        joined.append(torch.cat([_pad_left(a, axis, keep), _pad_left(b.to(a.device), axis, keep)], dim=0))
    for (holder, name, _), t in zip(mine, joined, strict=True):  # all or nothing: stored once all are made
        setattr(holder, name, t)
    for holder in {id(h): h for h, _, _ in mine if _sliding(h)}.values():
        holder.cumulative_length = w
    return running


def _pad_left(t: Tensor, axis: int, w: int) -> Tensor:
    missing = w - t.shape[axis]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[axis] = missing
    return torch.cat([t.new_zeros(shape), t], dim=axis)
