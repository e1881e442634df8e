"""Head ablation at ``blocks.{l}.attn.hook_z``: zero, mean or resample a query head's output.

``hook_z`` holds the attention output per *query* head, ``[batch, pos, head, d_head]``,
right before the output projection sums the heads. Replacing one head's slice there is
exactly "remove this head's contribution" and is correct for grouped-query attention
(several query heads share one key/value head; ablating a query head leaves its siblings
alone). :func:`ablate_kv_group` ablates every query head of one KV group.

Heads are 0-based, TransformerLens style: ``"L0H13"`` is layer 0, head 13, the paper's
"layer 1, head 14".

**Positions and the KV cache.** ``positions`` are absolute token positions in the sequence
(prompt positions first, then generated ones). In a full forward the hook sees every
position; in a KV-cached generation step it sees only the newest position. The ablation
finds the absolute positions of what it sees from :func:`lensprobe.generation.current_step`
inside ``lp.generate``/``lp.trace_generation`` (per row, counted from each row's first
prompt token, so left padding is accounted for), and otherwise from the attention pattern
of the same layer (``key_len - query_len``; a manual KV loop over one unpadded sequence), so:

- ``positions=None`` ablates every position, including every generated token;
- prompt positions (ints or a segment name) are ablated when the prompt is processed; the
  later layers' keys and values at those positions are cached with the ablation applied,
  so every later step sees them ablated, and the new positions are left alone;
- ``"generated"`` (or ``slice(n, None)``) ablates only the positions from ``n`` on.

A KV-cached generation with an ablation therefore gives the same logits as one uncached
forward over prompt + generated tokens with the same ablation. (In a manual KV loop over a
left-padded batch, outside ``lp.generate``, positions would count from the start of each
padded row.)
"""

import re
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor

from lensprobe.errors import LensprobeError
from lensprobe.interventions import Hook
from lensprobe.models import check_heads, check_layers

Method = Literal["zero", "mean", "resample"]
METHODS = ("zero", "mean", "resample")

_HEAD_RE = re.compile(r"^L(\d+|\*)H(\d+)$", re.IGNORECASE)
_ALL_LAYERS_RE = re.compile(r"^H(\d+)$", re.IGNORECASE)
_KV_RE = re.compile(r"^L(\d+)(?:KV|G)(\d+)$", re.IGNORECASE)
_HEAD_FORMS = (
    "write 'L{layer}H{head}' (0-based: 'L0H13' is the paper's layer 1, head 14), 'H13' for "
    "head 13 in every layer, a (layer, head) pair, (None, head) for every layer, or 'all'"
)


def head_label(layer: int, head: int) -> str:
    """TransformerLens-style label, e.g. ``head_label(0, 13) == "L0H13"``."""
    return f"L{layer}H{head}"


def hook_z_name(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_z"


def _pattern_name(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_pattern"


# --------------------------------------------------------------------------- head specs


def _is_int(x: Any) -> bool:
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
        raise LensprobeError(f"no heads given: {_HEAD_FORMS}; pass [] to ablate nothing.")
    if isinstance(heads, str):
        parts = [p.strip() for p in heads.split(",") if p.strip()]
        if not parts:
            raise LensprobeError(f"empty head specification {heads!r}: {_HEAD_FORMS}.")
        return tuple(_parse_one(p) for p in parts)
    if isinstance(heads, tuple) and len(heads) == 2 and all(h is None or _is_int(h) for h in heads):
        return (_parse_one(heads),)
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
        if all(v is None or _is_int(v) for v in (layer, head)):
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
    if not _is_int(group) or not 0 <= group < n_kv:
        raise LensprobeError(
            f"KV group {group} out of range: model has {n_kv} key/value heads per layer "
            f"(0-{n_kv - 1}), counted from 0."
        )
    per = n_heads // n_kv
    return [(layer, h) for h in range(group * per, (group + 1) * per)]


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
        prompt: a :class:`~lensprobe.prompts.Prompt` to look segment names up in.
    """
    if positions is None or isinstance(positions, Positions):
        return positions
    if _is_int(positions):
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
        if _is_int(item):
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
    if not _is_int(p) or p < 0:
        raise LensprobeError(
            f"position {p!r} is invalid: positions are absolute token indices >= 0 (no negative "
            "indexing, since the sequence grows during generation)."
        )
    return p


def _is_segment_spec(positions: Any) -> bool:
    """True when ``positions`` names prompt segments (``"generated"`` alone needs no prompt)."""
    if isinstance(positions, str):
        return positions != "generated"
    return isinstance(positions, (list, tuple)) and any(isinstance(p, str) and p != "generated" for p in positions)


class _Offset:
    """Absolute position of the first query row, read from the layer's attention pattern."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: int | None = None

    def record(self, pattern: Tensor, hook) -> None:
        self.value = int(pattern.shape[-1] - pattern.shape[-2])

    def take(self, layer: int) -> int:
        if self.value is None:
            raise LensprobeError(
                f"could not tell which token positions layer {layer} is processing (its "
                "attention pattern hook did not fire): position-dependent ablation needs a model "
                "with eager attention, as lp.load_model() returns."
            )
        value, self.value = self.value, None
        return value


# --------------------------------------------------------------------------- reference values


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


def _take_positions(v: Tensor, pos: Tensor, selected: Tensor, *, what: str) -> Tensor:
    """``v[pos]`` (``[rows, count, ...]``) with a clear error when a selected position is past ``v``."""
    n = v.shape[0]
    pos = pos.to(v.device)
    chosen = pos[selected.to(v.device) & (pos >= 0)]
    if chosen.numel() and int(chosen.max()) >= n:
        raise LensprobeError(
            f"position {int(chosen.max())} is ablated but the {what} has only {n} positions (0-{n - 1}): "
            "use a longer reference, restrict positions=..., or use per_position=False."
        )
    return v[pos.clamp(min=0, max=n - 1)]


def _as_token_list(model, reference) -> list[Tensor]:
    from lensprobe.run import as_tokens

    if isinstance(reference, (str, bytes)):
        raise LensprobeError(
            "reference must be prompts (lp.build_prompt) or token ids, not a string; build a "
            "Prompt from the text first."
        )
    items = reference if isinstance(reference, (list, tuple)) and not all(
        _is_int(t) for t in reference) else [reference]
    out = []
    for item in items:
        tokens = as_tokens(model, item)
        out.extend(tokens[i: i + 1] for i in range(tokens.shape[0]))
    if not out:
        raise LensprobeError("reference is empty: pass at least one prompt.")
    return out


@dataclass
class _ZRecorder:
    layers: list[int]
    z: dict[int, Tensor] = field(default_factory=dict)

    def hooks(self, model) -> list[Hook]:
        return [(hook_z_name(layer), self._hook(layer)) for layer in self.layers]

    def _hook(self, layer: int):
        def record(z: Tensor, hook) -> None:
            self.z[layer] = z.detach().clone()

        return record


def record_z(model, tokens, layers: Sequence[int]) -> dict[int, Float[Tensor, "batch pos head_index d_head"]]:
    """``hook_z`` of the given layers for one forward pass (nothing else is kept)."""
    from lensprobe.run import forward

    layers = check_layers(model, list(layers))
    rec = _ZRecorder(layers)
    last = max(layers) + 1 if layers else 1
    forward(model, tokens, rec, stop_at_layer=last if last < model.cfg.n_layers else None)
    return rec.z


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
    items = _as_token_list(model, reference)
    longest = max(t.shape[1] for t in items)
    sums: dict[int, Tensor] = {}
    counts = torch.zeros(longest, dtype=torch.float64)
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


def _replacement_source(model, method: str, reference, layers: list[int], per_position: bool):
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
    items = _as_token_list(model, reference)
    if len(items) != 1:
        raise LensprobeError(
            f"resample ablation takes its values from one reference prompt, got {len(items)}; "
            "pass a single prompt (use method='mean' to average over several)."
        )
    z = record_z(model, items[0], layers)
    return {layer: z[layer][0] for layer in layers}  # [pos, head, d_head]


def _values_for(source, layer: int, pos: Tensor | None, selected: Tensor) -> Tensor | None:
    """Replacement values broadcastable to ``[batch, count, head, d_head]`` (None = zeros)."""
    if source is None:
        return None
    if isinstance(source, HeadMeans):
        return source.at(layer, pos, selected)
    return _take_positions(source[layer], pos, selected, what="resample reference prompt")


def _check_method(method: str, reference) -> None:
    if method not in METHODS:
        raise LensprobeError(f"unknown ablation method {method!r}: use one of {METHODS}.")
    if method == "mean" and reference is None:
        raise LensprobeError(
            "method='mean' needs reference=...: a set of prompts to average each head's output "
            "over (or lp.head_means(model, prompts)). Use method='zero' for no reference."
        )
    if method == "resample" and reference is None:
        raise LensprobeError(
            "method='resample' needs reference=...: the prompt whose head outputs replace the ablated ones."
        )
    if method == "zero" and reference is not None:
        raise LensprobeError("method='zero' takes no reference; use method='mean' or 'resample' to use one.")


# --------------------------------------------------------------------------- the hook


@dataclass(frozen=True)
class ZAblationHook:
    """Replaces selected ``hook_z`` slices of one layer.

    ``head_mask`` is ``[rows, head]``: ``rows == 1`` applies the same heads to every batch
    row; otherwise row ``b`` of the batch ablates the heads marked in ``head_mask[b]``
    (the sweep puts a different head in each batch row).
    """

    layer: int
    head_mask: Tensor
    positions: Positions | None = None
    source: Any = None
    offset: _Offset | None = None

    def __call__(self, z: Tensor, hook) -> Tensor | None:
        batch, count = z.shape[0], z.shape[1]
        if self.head_mask.shape[0] not in (1, batch):
            raise LensprobeError(
                f"this ablation was built for {self.head_mask.shape[0]} batch rows but the input has {batch}."
            )
        if self.offset is None:  # position-independent: every position, no lookups
            selected = torch.ones(1, count, dtype=torch.bool, device=z.device)
            pos = None
        else:
            pos, lengths = _absolute_positions(self.offset, self.layer, batch, count, z.device)
            selected = torch.ones_like(pos, dtype=torch.bool) if self.positions is None \
                else self.positions.select(pos, lengths)
            if not bool(selected.any()):
                return None
        mask = selected[:, :, None] & self.head_mask.to(z.device)[:, None, :]  # [rows, pos, head]
        values = _values_for(self.source, self.layer, pos, selected)  # pos is None only when unused
        if values is None:
            return z.masked_fill(mask[..., None], 0.0)
        return torch.where(mask[..., None], values.to(z.device, z.dtype).expand_as(z), z)


def _absolute_positions(offset: _Offset, layer: int, batch: int, count: int,
                        device) -> tuple[Tensor, Tensor | None]:
    """``[rows, count]`` absolute positions of the ``pos`` axis this hook sees, and the
    ``[rows]`` prompt lengths when known (inside ``lp.generate``).

    Inside :func:`lensprobe.generate` / ``trace_generation`` the loop publishes them per row
    (counted from each row's first prompt token, so left padding is accounted for);
    otherwise the layer's attention pattern tells: row 0 of ``count`` queries over ``K``
    keys is position ``K - count``.
    """
    first = offset.take(layer)
    info = _step_info()
    if info is not None and info.positions.shape[-1] == count and info.positions.shape[0] in (1, batch):
        return info.positions.to(device), info.prompt_lengths
    return torch.arange(first, first + count, device=device)[None], None


def _step_info():
    try:
        from lensprobe.generation import current_step
    except ImportError:  # pragma: no cover - generation is part of lensprobe
        return None
    return current_step()


def _build_hooks(model, layer_masks: dict[int, Tensor], positions: Positions | None,
                 source) -> list[Hook]:
    needs_offset = positions is not None or (source is not None and not (
        isinstance(source, HeadMeans) and not source.per_position))
    hooks: list[Hook] = []
    for layer, mask in layer_masks.items():
        offset = _Offset() if needs_offset else None
        if offset is not None:
            hooks.append((_pattern_name(layer), offset.record))
        hooks.append((hook_z_name(layer), ZAblationHook(layer, mask, positions, source, offset)))
    return hooks


# --------------------------------------------------------------------------- interventions


@dataclass(frozen=True, eq=False)
class HeadAblation:
    """Intervention: ablate query heads at ``hook_z``. Build it with :func:`ablate_heads`.

    Reference activations (``mean``/``resample``) are computed on first use per model (with
    whatever hooks are attached at that moment) and then reused; pass a
    :class:`HeadMeans` from :func:`head_means` to control that yourself.
    """

    heads: tuple
    method: Method = "zero"
    positions: Any = None
    reference: Any = None
    per_position: bool = False
    kv_groups: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        # Reference activations per model, computed on first use. Not a dataclass field, so
        # dataclasses.asdict (used to describe a run) never copies models or activations.
        object.__setattr__(self, "_cache", weakref.WeakKeyDictionary())

    def __repr__(self) -> str:
        def sel(layer, head):
            return "all" if layer is None and head is None else (
                f"L{'*' if layer is None else layer}H{'*' if head is None else head}")

        parts = [f"heads={','.join(sel(*s) for s in self.heads)!r}"] if self.heads else []
        if self.kv_groups:
            parts.append(f"kv_groups={','.join(f'L{lay}KV{g}' for lay, g in self.kv_groups)!r}")
        parts.append(f"method={self.method!r}")
        if isinstance(self.positions, Positions):
            fixed = _ranges(sorted(self.positions.fixed))
            desc = [f"[{fixed}]"] if fixed else []
            desc += [f"from {self.positions.start}"] if self.positions.start is not None and not self.positions.generated else []
            desc += ["generated"] if self.positions.generated else []
            parts.append(f"positions={' + '.join(desc)}")
        elif self.positions is not None:
            parts.append(f"positions={self.positions!r}")
        if self.reference is not None:
            parts.append(f"reference=<{_describe_reference(self.reference)}>")
        if self.per_position:
            parts.append("per_position=True")
        return f"HeadAblation({', '.join(parts)})"

    def resolve(self, model) -> list[tuple[int, int]]:
        """The ``(layer, head)`` pairs this ablation touches on ``model``."""
        pairs = resolve_heads(model, self.heads) if self.heads else []
        for layer, group in self.kv_groups:
            for pair in kv_group_heads(model, layer, group):
                if pair in pairs:
                    raise LensprobeError(f"head {head_label(*pair)} is given twice; name each head once.")
                pairs.append(pair)
        return pairs

    def bind(self, prompt) -> "HeadAblation":
        """A copy with segment-name positions resolved against ``prompt`` (``self`` when there
        are none; ``"generated"`` alone needs no prompt inside ``lp.generate``)."""
        if not _is_segment_spec(self.positions):
            return self  # ints, or "generated" (placed per row by lp.generate)
        return HeadAblation(self.heads, self.method, resolve_positions(self.positions, prompt),
                            self.reference, self.per_position, self.kv_groups)

    def hooks(self, model) -> list[Hook]:
        positions = resolve_positions(self.positions)
        pairs = self.resolve(model)
        n_heads = int(model.cfg.n_heads)
        masks: dict[int, Tensor] = {}
        for layer, head in pairs:
            masks.setdefault(layer, torch.zeros(1, n_heads, dtype=torch.bool))[0, head] = True
        source = self._source(model, sorted(masks))
        return _build_hooks(model, dict(sorted(masks.items())), positions, source)

    def _source(self, model, layers: list[int]):
        if self.method == "zero" or not layers:
            return None
        try:
            cached = self._cache.get(model)
        except TypeError:
            cached = None
        if cached is not None and all(_has_layer(cached, layer) for layer in layers):
            return cached
        source = _replacement_source(model, self.method, self.reference, layers, self.per_position)
        try:
            self._cache[model] = source
        except TypeError:
            pass
        return source


def _ranges(values: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3,7"``."""
    out, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(out)


def _describe_reference(ref) -> str:
    """Count and a short content digest of a reference (the same in every process)."""
    import hashlib

    digest = hashlib.sha256()
    if isinstance(ref, HeadMeans):
        for layer in sorted(ref.values):
            digest.update(ref.values[layer].detach().cpu().contiguous().numpy().tobytes())
        return f"HeadMeans over {ref.n_prompts} prompts, sha256 {digest.hexdigest()[:12]}"
    items = ref if isinstance(ref, (list, tuple)) and not all(_is_int(t) for t in ref) else [ref]
    for item in items:
        tokens = getattr(item, "tokens", item)
        ids = tokens.flatten().tolist() if isinstance(tokens, Tensor) else list(tokens)
        digest.update((",".join(str(int(i)) for i in ids) + ";").encode())
    return f"{len(items)} prompt{'s' if len(items) != 1 else ''}, sha256 {digest.hexdigest()[:12]}"


def _has_layer(source, layer: int) -> bool:
    return layer in (source.values if isinstance(source, HeadMeans) else source)


def ablate_heads(heads: Any, *, method: Method = "zero", positions: Any = None, reference: Any = None,
                 per_position: bool = False, prompt=None) -> HeadAblation:
    """Ablate attention heads at ``blocks.{l}.attn.hook_z`` (per query head; GQA-correct).

    Use it like any intervention: in ``lp.intervene``, ``lp.forward``, generation tracing
    or evaluations.

    Args:
        heads: ``[(layer, head), ...]``, labels ``"L0H13"`` (0-based; the paper's layer 1
            head 14), ``"H13"`` (head 13 in every layer), a comma-separated string of labels,
            or ``"all"``. ``[]`` ablates nothing.
        method: ``"zero"`` sets the head's output to 0; ``"mean"`` to its mean over
            ``reference`` prompts; ``"resample"`` to its output on the ``reference`` prompt
            (same absolute positions).
        positions: ``None`` (every position, also every generated token), token positions,
            a ``slice`` (``slice(n, None)`` = from ``n`` on), a segment name such as
            ``"question"`` or a list of names (resolved against ``prompt`` or via
            :meth:`HeadAblation.bind`), or ``"generated"`` (positions after the prompt). See
            the module docs for what positions mean under the KV cache.
        reference: prompts for ``mean`` (or a :class:`HeadMeans`), one prompt for
            ``resample``.
        per_position: for ``mean``: average per absolute position instead of over all
            positions.
        prompt: the prompt that segment names in ``positions`` refer to.

    Raises:
        LensprobeError: malformed labels (``"L0X3"``), unknown method, ``mean``/``resample``
            without a reference. Heads out of range and duplicates are reported when the
            ablation is attached to a model (before any forward runs).

    Example:
        >>> with lp.intervene(model, lp.ablate_heads(["L0H3", (1, 2)])):
        ...     logits = model(prompt.tokens)
        >>> abl = lp.ablate_heads("H4", positions="question", prompt=prompt)
    """
    _check_method(method, reference)
    selectors = parse_heads(heads) if not (isinstance(heads, (list, tuple)) and len(heads) == 0) else ()
    if positions is not None and prompt is not None:
        positions = resolve_positions(positions, prompt)
    elif positions is not None and not _is_segment_spec(positions):
        positions = resolve_positions(positions)
    return HeadAblation(selectors, method, positions, reference, per_position)


def ablate_kv_group(groups: Any, *, method: Method = "zero", positions: Any = None, reference: Any = None,
                    per_position: bool = False, prompt=None) -> HeadAblation:
    """Ablate every query head that shares one key/value head (a GQA group) at ``hook_z``.

    Query head ``h`` reads KV head ``h // (n_heads // n_kv_heads)``; on SmolLM2 (9 query
    heads, 3 KV heads) group 1 of layer 0 is heads L0H3, L0H4, L0H5. Zero-ablating a group
    equals zeroing that KV head's values.

    Args:
        groups: ``[(layer, kv_head), ...]`` or labels ``"L0KV1"`` (comma-separated allowed).
        method, positions, reference, per_position, prompt: as in :func:`ablate_heads`.

    Example:
        >>> with lp.intervene(model, lp.ablate_kv_group("L0KV1")):
        ...     logits = model(prompt.tokens)
    """
    _check_method(method, reference)
    parsed = _parse_groups(groups)
    if len(set(parsed)) != len(parsed):
        dup = next(g for g in parsed if parsed.count(g) > 1)
        raise LensprobeError(f"KV group L{dup[0]}KV{dup[1]} is given twice; name each group once.")
    if positions is not None and prompt is not None:
        positions = resolve_positions(positions, prompt)
    elif positions is not None and not _is_segment_spec(positions):
        positions = resolve_positions(positions)
    return HeadAblation((), method, positions, reference, per_position, kv_groups=tuple(parsed))


def _parse_groups(groups: Any) -> list[tuple[int, int]]:
    forms = "write 'L{layer}KV{group}' (e.g. 'L0KV1') or a (layer, kv_head) pair"
    if isinstance(groups, str):
        items: list[Any] = [g.strip() for g in groups.split(",") if g.strip()]
    elif isinstance(groups, tuple) and len(groups) == 2 and all(_is_int(g) for g in groups):
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
        elif isinstance(item, (tuple, list)) and len(item) == 2 and all(_is_int(v) for v in item):
            out.append((int(item[0]), int(item[1])))
        else:
            raise LensprobeError(f"{item!r} is not a KV group: {forms}.")
    return out


# --------------------------------------------------------------------------- per-row ablation


@dataclass(frozen=True)
class RowHeadAblation:
    """Intervention for batched sweeps: batch row ``b`` ablates head ``rows[b]``.

    ``rows[b]`` is a ``(layer, head)`` pair, or ``None`` for an unablated row. One forward
    over a batch of copies of the same prompt thus measures several single-head ablations.
    """

    rows: tuple[tuple[int, int] | None, ...]
    method: Method = "zero"
    positions: Positions | None = None
    source: Any = None

    def hooks(self, model) -> list[Hook]:
        n_heads = int(model.cfg.n_heads)
        masks: dict[int, Tensor] = {}
        for b, pair in enumerate(self.rows):
            if pair is None:
                continue
            layer, head = pair
            masks.setdefault(layer, torch.zeros(len(self.rows), n_heads, dtype=torch.bool))[b, head] = True
        return _build_hooks(model, dict(sorted(masks.items())), self.positions, self.source)


def ablation_source(model, method: Method, reference, layers: Sequence[int], per_position: bool = False):
    """Reference values for ``method`` over ``layers`` (``None`` for zero ablation)."""
    _check_method(method, reference)
    return _replacement_source(model, method, reference, sorted(set(layers)), per_position)
