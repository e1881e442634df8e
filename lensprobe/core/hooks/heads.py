"""Naming attention heads, KV groups and token positions (for ablation, patching and sweeps).

Heads are 0-based, TransformerLens style: ``"L0H13"`` is layer 0, head 13, the paper's
"layer 1, head 14"; ``"H13"`` is head 13 in every layer; ``"L0KV1"`` is key/value head 1
of layer 0 (a GQA group). Positions are absolute token positions (prompt positions first,
then generated ones), given as ints, slices, segment names or ``"generated"``.

Example:
    >>> parse_heads(["L0H13", (2, 1), "H4"])
    ((0, 13), (2, 1), (None, 4))
    >>> resolve_positions(slice(10, None))
    Positions(fixed=frozenset(), start=10, generated=False)
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.models.loading import check_heads, check_layers

__all__ = ["Positions", "head_label", "hook_z_name", "is_int", "is_segment_spec", "kv_group_heads", "parse_heads",
           "parse_kv_groups",
           "resolve_heads", "resolve_positions"]

_HEAD_RE = re.compile(r"^L(\d+|\*)H(\d+)$", re.IGNORECASE | re.ASCII)  # ASCII: 'L٣H1' is not layer 3
_ALL_LAYERS_RE = re.compile(r"^H(\d+)$", re.IGNORECASE | re.ASCII)
_KV_RE = re.compile(r"^L(\d+)(?:KV|G)(\d+)$", re.IGNORECASE | re.ASCII)
_HEAD_FORMS = (
    "write 'L{layer}H{head}' (0-based: 'L0H13' is the paper's layer 1, head 14), 'H13' for "
    "head 13 in every layer, a (layer, head) pair, (None, head) for every layer, or 'all'"
)



def head_label(layer: int, head: int) -> str:
    """TransformerLens-style label, e.g. ``head_label(0, 13) == "L0H13"``."""
    return f"L{layer}H{head}"


def hook_z_name(layer: int) -> str:
    """Hook point of the attention output per query head, ``[batch, pos, head, d_head]``."""
    return f"blocks.{layer}.attn.hook_z"



def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_heads(heads: Any) -> tuple[tuple[int | None, int | None], ...]:
    """Parse a head specification without a model (syntax only).

    Returns ``(layer, head)`` selectors where ``None`` means "every": ``(None, 13)`` is head
    13 in every layer, ``(None, None)`` every head of every layer.

    Accepted: ``"all"``; a label ``"L0H13"``, ``"L*H13"`` or ``"H13"``; a comma-separated
    string of labels; a ``(layer, head)`` pair (``None`` for every layer or every head);
    or a list of any of these.

    Example:
        >>> parse_heads(["L0H13", (2, 1), "H4"])
        ((0, 13), (2, 1), (None, 4))
    """
    if heads is None:
        raise LensprobeError(f"no heads given: {_HEAD_FORMS}; pass at least one head, e.g. 'L0H1'.")
    if isinstance(heads, str):
        parts = [p.strip() for p in heads.split(",") if p.strip()]
        if not parts:
            raise LensprobeError(f"empty head specification {heads!r}: {_HEAD_FORMS}.")
        return tuple(_parse_one(p) for p in parts)
    if isinstance(heads, tuple) and len(heads) == 2 and all(h is None or is_int(h) for h in heads):
        return (_parse_one(heads),)
    if isinstance(heads, tuple) and len(heads) == 2 and (heads[0] is None or is_int(heads[0])):
        raise LensprobeError(  # a layer and something else: a pair with a bad head, not two selectors
            f"{heads!r} is not a (layer, head) pair: the head must be an int or None, got "
            f"{type(heads[1]).__name__} {heads[1]!r}; {_HEAD_FORMS}."
        )
    if isinstance(heads, Iterable):
        return tuple(sel for item in heads for sel in (parse_heads(item) if isinstance(item, str)
                                                      else (_parse_one(item),)))
    raise LensprobeError(f"cannot read heads from {heads!r}: {_HEAD_FORMS}.")


def _parse_one(item: Any) -> tuple[int | None, int | None]:
    if isinstance(item, str):
        s = item.strip()
        if s.lower() == "all":
            return (None, None)
        m = _HEAD_RE.match(s)
        if m:
            return (None if m.group(1) == "*" else int(m.group(1)), int(m.group(2)))
        m = _ALL_LAYERS_RE.match(s)
        if m:
            return (None, int(m.group(1)))
        raise LensprobeError(f"{item!r} is not a head label: {_HEAD_FORMS}.")
    if isinstance(item, (tuple, list)) and len(item) == 2:
        layer, head = item
        if all(v is None or is_int(v) for v in (layer, head)):
            return (layer, head)
    raise LensprobeError(f"{item!r} is not a head: {_HEAD_FORMS}.")


def resolve_heads(model, heads: Any) -> list[tuple[int, int]]:
    """Validated, expanded ``[(layer, head), ...]`` for a model, in the order given.

    Raises:
        LensprobeError: malformed labels, a layer or head out of the model's range (the
            message gives the range and reminds that papers count from 1), or a head
            named twice.

    Example:
        >>> resolve_heads(model, "H2")[:2]   # head 2 of every layer
        [(0, 2), (1, 2)]
    """
    selectors = parse_heads(heads)
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    out: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    for layer, head in selectors:
        layers = range(n_layers) if layer is None else check_layers(model, [layer])
        hs = range(n_heads) if head is None else check_heads(model, [head])
        for pair in ((lay, h) for lay in layers for h in hs):
            if pair in seen:
                raise LensprobeError(
                    f"head {head_label(*pair)} is given twice; name each head once "
                    "(note 'H{h}' already covers every layer)."
                )
            seen.add(pair)
            out.append(pair)
    return out


def kv_group_heads(model, layer: int, group: int) -> list[tuple[int, int]]:
    """Query heads that share KV head ``group`` in ``layer`` (Hugging Face's ``repeat_kv``
    order: query head ``h`` reads KV head ``h // (n_heads // n_kv_heads)``)."""
    check_layers(model, [layer])
    n_heads = int(model.cfg.n_heads)
    n_kv = int(getattr(model.cfg, "n_key_value_heads", None) or n_heads)
    if not is_int(group) or not 0 <= group < n_kv:
        raise LensprobeError(
            f"KV group {group} out of range: model has {n_kv} key/value heads per layer "
            f"(0-{n_kv - 1}), counted from 0."
        )
    per = n_heads // n_kv
    return [(layer, h) for h in range(group * per, (group + 1) * per)]


def parse_kv_groups(groups: Any) -> list[tuple[int, int]]:
    """``[(layer, kv_head), ...]`` from labels ``"L0KV1"`` (comma-separated allowed) or pairs."""
    forms = "write 'L{layer}KV{group}' (e.g. 'L0KV1') or a (layer, kv_head) pair"
    if isinstance(groups, str):
        items: list[Any] = [g.strip() for g in groups.split(",") if g.strip()]
    elif isinstance(groups, tuple) and len(groups) == 2 and all(is_int(g) for g in groups):
        items = [groups]
    elif isinstance(groups, Iterable):
        items = list(groups)
    else:
        raise LensprobeError(f"cannot read KV groups from {groups!r}: {forms}.")
    out = []
    for item in items:
        if isinstance(item, str):
            m = _KV_RE.match(item.strip())
            if not m:
                raise LensprobeError(f"{item!r} is not a KV group label: {forms}.")
            out.append((int(m.group(1)), int(m.group(2))))
        elif isinstance(item, (tuple, list)) and len(item) == 2 and all(is_int(v) for v in item):
            out.append((int(item[0]), int(item[1])))
        else:
            raise LensprobeError(f"{item!r} is not a KV group: {forms}.")
    return out


# --------------------------------------------------------------------------- positions


@dataclass(frozen=True)
class Positions:
    """A set of absolute token positions: fixed ones, every position from ``start`` on, and
    (``generated``) every position after the prompt."""

    fixed: frozenset[int] = frozenset()
    start: int | None = None
    generated: bool = False

    def select(self, pos: Tensor, prompt_lengths: Tensor | None = None) -> Tensor:
        """Bool tensor shaped like ``pos`` (``[rows, count]`` absolute positions): which are selected.

        ``prompt_lengths`` (``[rows]``, known inside ``lp.generate``) places "after the
        prompt" per row; without it a ``generated`` set needs ``start``.
        """
        sel = torch.zeros(pos.shape, dtype=torch.bool, device=pos.device)
        if self.fixed:
            sel |= torch.isin(pos, torch.tensor(sorted(self.fixed), device=pos.device))
        if self.generated and prompt_lengths is not None:
            sel |= pos >= prompt_lengths.to(pos.device).reshape(-1, 1)
        elif self.generated and self.start is None:
            raise LensprobeError(
                "positions='generated' needs the prompt length: run inside lp.generate / lp.trace_generation, "
                "or pass prompt=... to ablate_heads."
            )
        if self.start is not None and not (self.generated and prompt_lengths is not None):
            sel |= pos >= self.start
        return sel


def resolve_positions(positions: Any, prompt=None) -> Positions | None:
    """Turn a position spec into :class:`Positions` (``None`` = every position).

    Args:
        positions: ``None``; an int; a list of ints; a ``range``; a ``slice(start, stop)``
            (``stop=None`` is open-ended, e.g. ``slice(len(prompt), None)`` for generated
            tokens only); a segment name or list of names (needs ``prompt``); ``"generated"``
            (every position after the prompt; needs ``prompt``).
        prompt: a :class:`~lensprobe.core.prompts.prompt.Prompt` to look segment names up in.
    """
    if positions is None or isinstance(positions, Positions):
        return positions
    if is_int(positions):
        positions = [positions]
    if isinstance(positions, str):
        positions = [positions]
    if isinstance(positions, slice):
        if positions.step not in (None, 1):
            raise LensprobeError("a positions slice cannot have a step.")
        start = positions.start or 0
        if positions.stop is None:
            return Positions(start=_nonneg(start))
        return Positions(fixed=frozenset(range(_nonneg(start), _nonneg(positions.stop))))
    if isinstance(positions, torch.Tensor):
        positions = positions.flatten().tolist()
    if not isinstance(positions, Iterable):
        raise LensprobeError(f"cannot read positions from {positions!r}: pass ints or segment names.")
    fixed: set[int] = set()
    start = None
    generated = False
    for item in positions:
        if is_int(item):
            fixed.add(_nonneg(item))
        elif item == "generated":
            generated = True
            start = len(prompt) if prompt is not None and hasattr(prompt, "positions") else None
        elif isinstance(item, str):
            if prompt is None or not hasattr(prompt, "positions"):
                raise LensprobeError(
                    f"positions={item!r} names a prompt segment: pass prompt=... (a Prompt from "
                    "lp.build_prompt) or call .bind(prompt) on the ablation."
                )
            fixed.update(prompt.positions(item))
        else:
            raise LensprobeError(f"cannot read position {item!r}: pass ints or segment names.")
    return Positions(fixed=frozenset(fixed), start=start, generated=generated)


def _nonneg(p: int) -> int:
    if not is_int(p) or p < 0:
        raise LensprobeError(
            f"position {p!r} is invalid: positions are absolute token indices >= 0 (no negative "
            "indexing, since the sequence grows during generation)."
        )
    return p


def is_segment_spec(positions: Any) -> bool:
    """True when ``positions`` names prompt segments (``"generated"`` alone needs no prompt)."""
    if isinstance(positions, str):
        return positions != "generated"
    return isinstance(positions, (list, tuple)) and any(isinstance(p, str) and p != "generated" for p in positions)
