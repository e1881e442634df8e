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
finds the absolute positions of what it sees from the step its hook receives (``hook.step``,
:class:`~lensprobe.core.hooks.hookpoint.StepContext`): inside ``lp.generate``/``lp.trace_generation``
per row, counted from each row's first prompt token; in any other forward inside
``lp.intervene`` from the forward's own inputs (the KV cache's length, and each row's left
padding where an ``attention_mask`` is passed), on any attention implementation, so:

- ``positions=None`` ablates every position, including every generated token;
- prompt positions (ints or a segment name) are ablated when the prompt is processed; the
  later layers' keys and values at those positions are cached with the ablation applied,
  so every later step sees them ablated, and the new positions are left alone;
- ``"generated"`` (or ``slice(n, None)``) ablates only the positions from ``n`` on.

A KV-cached generation with an ablation therefore gives the same logits as one uncached
forward over prompt + generated tokens with the same ablation, also in a manual KV loop
inside ``lp.intervene`` (pass the ``attention_mask`` of a left-padded batch).
"""

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import Capabilities, Hook, positions_of
from lensprobe.core.hooks.heads import (
    Positions,
    head_label,
    hook_z_name,
    is_int,
    is_segment_spec,
    kv_group_heads,
    parse_heads,
    parse_kv_groups,
    resolve_heads,
    resolve_positions,
)
from lensprobe.core.storage.jsonable import digest
from lensprobe.interventions.replacement import (
    HeadMeans,
    Method,
    check_method,
    replacement_source,
    replacement_values,
)

__all__ = ["HeadAblation", "RowHeadAblation", "ZAblationHook", "ablate_heads", "ablate_kv_group",
           "check_ablation_positions"]


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
    by_position: bool = False

    def __call__(self, z: Tensor, hook) -> Tensor | None:
        batch, count = z.shape[0], z.shape[1]
        if self.head_mask.shape[0] not in (1, batch):
            raise LensprobeError(
                f"this ablation was built for {self.head_mask.shape[0]} batch rows but the input has {batch}."
            )
        if not self.by_position:  # position-independent: every position, no lookups
            selected = torch.ones(1, count, dtype=torch.bool, device=z.device)
            pos = None
        else:
            pos, lengths = positions_of(hook, batch, count, f"head ablation at layer {self.layer}")
            pos = pos.to(z.device)
            selected = torch.ones_like(pos, dtype=torch.bool) if self.positions is None \
                else self.positions.select(pos, lengths)
            if not bool(selected.any()):
                return None
        mask = selected[:, :, None] & self.head_mask.to(z.device)[:, None, :]  # [rows, pos, head]
        values = replacement_values(self.source, self.layer, pos, selected)  # pos is None only when unused
        if values is None:
            return z.masked_fill(mask[..., None], 0.0)
        return torch.where(mask[..., None], values.to(z.device, z.dtype).expand_as(z), z)


def _build_hooks(model, layer_masks: dict[int, Tensor], positions: Positions | None,
                 source) -> list[Hook]:
    by_position = positions is not None or (source is not None and not (
        isinstance(source, HeadMeans) and not source.per_position))
    return [(hook_z_name(layer), ZAblationHook(layer, mask, positions, source, by_position))
            for layer, mask in layer_masks.items()]


# --------------------------------------------------------------------------- interventions


@dataclass(frozen=True, eq=False)
class HeadAblation:
    """Intervention: ablate query heads at ``hook_z``. Build it with :func:`ablate_heads`.

    Reference activations (``mean``/``resample``) are computed on first use per model (with
    whatever hooks are attached at that moment) and then reused; pass a
    :class:`HeadMeans` from :func:`~lensprobe.interventions.replacement.head_means` to control that yourself.
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

    capabilities = Capabilities(positions=True, binds_to_prompt=True)

    def check_positions(self, length: int, what: str = "prompt") -> None:
        """Refuse positions outside a run of ``length`` positions (:func:`check_ablation_positions`)."""
        check_ablation_positions(self.positions, length, what)

    def bind(self, prompt) -> "HeadAblation":
        """A copy with segment-name positions resolved against ``prompt`` (``self`` when there
        are none; ``"generated"`` alone needs no prompt inside ``lp.generate``)."""
        if not is_segment_spec(self.positions):
            return self  # ints, or "generated" (placed per row by lp.generate)
        return HeadAblation(self.heads, self.method, resolve_positions(self.positions, prompt),
                            self.reference, self.per_position, self.kv_groups)

    def hooks(self, model) -> list[Hook]:
        positions = resolve_positions(self.positions)
        pairs = self.resolve(model)
        n_heads = int(model.cfg.n_heads)
        masks: dict[int, Tensor] = {}
        for layer, head in pairs:
            masks.setdefault(layer, torch.zeros(1, n_heads, dtype=torch.bool, device="cpu"))[0, head] = True
        source = self._source(model, sorted(masks))
        return _build_hooks(model, dict(sorted(masks.items())), positions, source)

    def _source(self, model, layers: list[int]):
        if self.method == "zero" or not layers:
            return None
        cache: weakref.WeakKeyDictionary = vars(self)["_cache"]  # set in __post_init__ (not a field)
        try:
            cached = cache.get(model)
        except TypeError:
            cached = None
        if cached is not None and all(_has_layer(cached, layer) for layer in layers):
            return cached
        source = replacement_source(model, self.method, self.reference, layers, self.per_position)
        try:
            cache[model] = source
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
    if isinstance(ref, HeadMeans):
        chunks = [ref.values[layer].detach().cpu().contiguous().numpy().tobytes() for layer in sorted(ref.values)]
        return f"HeadMeans over {ref.n_prompts} prompts, sha256 {digest(*chunks, length=12)}"
    items = ref if isinstance(ref, (list, tuple)) and not all(is_int(t) for t in ref) else [ref]
    texts = []
    for item in items:
        tokens: Any = getattr(item, "tokens", item)
        ids = tokens.flatten().tolist() if isinstance(tokens, Tensor) else list(tokens)
        texts.append(",".join(str(int(i)) for i in ids) + ";")
    return f"{len(items)} prompt{'s' if len(items) != 1 else ''}, sha256 {digest(*texts, length=12)}"


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
            or ``"all"``. An empty selection (``[]``, ``""``) is refused: to run without
            ablation pass no intervention.
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
        LensprobeError: no heads, malformed labels (``"L0X3"``), unknown method,
            ``mean``/``resample`` without a reference. Heads out of range and duplicates are reported when the
            ablation is attached to a model (before any forward runs).

    Example:
        >>> with lp.intervene(model, lp.ablate_heads(["L0H3", (1, 2)])):
        ...     logits = model(prompt.tokens)
        >>> abl = lp.ablate_heads("H4", positions="question", prompt=prompt)
    """
    check_method(method, reference)
    _refuse_empty(heads, "head, e.g. 'L0H1'")
    selectors = parse_heads(heads)
    if positions is not None and prompt is not None:
        positions = resolve_positions(positions, prompt)
    elif positions is not None and not is_segment_spec(positions):
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
        >>> with lp.intervene(model, lp.interventions.ablate_kv_group("L0KV1")):
        ...     logits = model(prompt.tokens)
    """
    check_method(method, reference)
    _refuse_empty(groups, "KV group, e.g. 'L0KV1'")
    parsed = parse_kv_groups(groups)
    if len(set(parsed)) != len(parsed):
        dup = next(g for g in parsed if parsed.count(g) > 1)
        raise LensprobeError(f"KV group L{dup[0]}KV{dup[1]} is given twice; name each group once.")
    if positions is not None and prompt is not None:
        positions = resolve_positions(positions, prompt)
    elif positions is not None and not is_segment_spec(positions):
        positions = resolve_positions(positions)
    return HeadAblation((), method, positions, reference, per_position, kv_groups=tuple(parsed))


def _refuse_empty(selection: Any, what: str) -> None:
    """An empty selection would silently ablate nothing: refuse it with the fix."""
    empty = (isinstance(selection, str) and not selection.replace(",", "").strip()) or (
        isinstance(selection, (list, tuple)) and len(selection) == 0)
    if empty:
        raise LensprobeError(f"no {what.split(',')[0]} to ablate in {selection!r}: pass at least one {what}; to "
                             "run without ablation pass no intervention.")


# --------------------------------------------------------------------------- position checks


def check_ablation_positions(positions: Any, length: int, what: str = "prompt") -> None:
    """Refuse ablation positions that no position of a run reaches, before any forward.

    An ablation whose token positions all lie outside the sequence would ablate nothing and
    report a zero effect; this says so instead. Positions still given as segment names are
    resolved against the prompt later (they lie inside it by construction), and
    ``"generated"`` adapts to each row; both pass. :func:`lensprobe.core.hooks.attach.check_positions`
    calls it through :meth:`HeadAblation.check_positions` for every entry point.

    Args:
        positions: a :class:`Positions` (anything else passes).
        length: how many positions the run processes: the prompt's tokens for a forward, the
            longest prompt + ``max_new_tokens`` for a generation.
        what: what ``length`` counts, for the message (``"prompt"``, ``"prompt + max_new_tokens"``).

    Raises:
        LensprobeError: no position at all (an empty list); ``"generated"`` resolved against a prompt
            in a run that generates nothing; a fixed position, or the start of an open range, at
            ``length`` or beyond.

    Example:
        >>> check_ablation_positions(resolve_positions([5000]), 39)
        Traceback (most recent call last):
        lensprobe.core.errors.LensprobeError: ablation positions 5000 lie outside the prompt ...
    """
    if not isinstance(positions, Positions):
        return
    if not positions.fixed and positions.start is None and not positions.generated:
        raise LensprobeError("no ablation positions given (an empty list): the ablation would ablate nothing and show "
                             "no effect. Pass at least one position, a segment name such as 'question', or "
                             "positions=None for every position.")
    if positions.generated and positions.start is not None and positions.start >= length:
        raise LensprobeError(
            f"positions='generated' were resolved against a prompt of {positions.start} tokens, and this run "
            f"processes {length} positions (the {what}), none generated: the ablation would ablate nothing and "
            "show no effect. Ablate 'generated' positions during a generation (lp.generate, lp.trace_generation, "
            "lp.evaluate), or choose prompt positions or a segment name such as 'question'.")
    outside = sorted(p for p in positions.fixed if p >= length)
    start = positions.start if positions.start is not None and not positions.generated else None
    if outside or (start is not None and start >= length):
        desc = _ranges(outside) if outside else f"from {start} on"
        raise LensprobeError(
            f"ablation positions {desc} lie outside the {what} ({length} tokens, positions 0-{length - 1}): "
            f"they would ablate nothing and show no effect. Choose positions below {length}, or a segment "
            "name such as 'question'."
        )


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

    capabilities = Capabilities(positions=True)

    def check_positions(self, length: int, what: str = "prompt") -> None:
        """Refuse positions outside a run of ``length`` positions (:func:`check_ablation_positions`)."""
        check_ablation_positions(self.positions, length, what)

    def hooks(self, model) -> list[Hook]:
        n_heads = int(model.cfg.n_heads)
        masks: dict[int, Tensor] = {}
        for b, pair in enumerate(self.rows):
            if pair is None:
                continue
            layer, head = pair
            masks.setdefault(layer, torch.zeros(len(self.rows), n_heads, dtype=torch.bool, device="cpu"))[b, head] = True
        return _build_hooks(model, dict(sorted(masks.items())), self.positions, self.source)
