"""Per-head activation patching across prompts of different lengths: :func:`patch_heads`.

``lp.patch`` patches whole hook points; :func:`patch_heads` patches one attention head at a
time: head ``h``'s output (``hook_z``) on the ``clean`` prompt is replaced, at every aligned
position, by its output on the ``corrupted`` prompt, and the metric's change is measured, one
exact run per head, batched as the ablation sweep batches (rows sorted by layer, the forward
below the lowest patched head shared).

**Alignment by segment.** The two prompts may differ in length. Positions are paired token by
token within named segments (``lp.build_prompt``'s ``system``, ``question``, ``answer`` ...):
by default every segment both prompts have, in order, so a prompt with the meaningless filler
and the same prompt without it pair every position except the filler's (and its separator); a
segment only one prompt has has no counterpart: it is never patched, and the result says so
(:attr:`HeadPatch.unmatched`). ``segments=[...]`` patches the named segments only.

Which heads carry the filler's effect on the next-token entropy: the clean prompt is the one
with the filler, the corrupted one the same question without it; a head whose patched output
moves the entropy back carries part of the filler's effect at the positions both prompts share.

Example:
    >>> with_filler = lp.build_prompt(model, q, system=lp.MATH_SYSTEM_PROMPT, filler=lp.Filler.meaningless())
    >>> without = lp.build_prompt(model, q, system=lp.MATH_SYSTEM_PROMPT)
    >>> res = lp.patch_heads(model, with_filler, without, "entropy")
    >>> res.top(5), res.unmatched
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.forward import as_prompts
from lensprobe.core.hooks.heads import Positions, resolve_heads
from lensprobe.core.measures.forced import resolve_measures
from lensprobe.experiments.patching import segment_alignment
from lensprobe.experiments.sweep import PREFIX_SAFE, SweepResult, layer_chunks, sweep_prompt
from lensprobe.interventions.replacement import record_z

__all__ = ["HeadPatch", "aligned_positions", "aligned_source", "patch_heads"]


@dataclass
class HeadPatch(SweepResult):
    """A :class:`~lensprobe.experiments.sweep.SweepResult` of patched heads (``method="patch"``:
    ``ablated`` holds the metric with the head patched, ``baseline`` the clean metric), and the
    alignment it used.

    Attributes:
        clean_positions, corrupted_positions: the paired positions, in order.
        unmatched: segment -> which prompt alone has it (never patched: no counterpart).
    """

    clean_positions: tuple[int, ...] = ()
    corrupted_positions: tuple[int, ...] = ()
    unmatched: tuple[tuple[str, str], ...] = ()

    def summary(self) -> str:
        """One line: what was patched and where the largest changes are."""
        top = self.top(3)
        where = ", ".join(f"{r.label} {r.change:+.4g}" for r in top.itertuples())
        alone = "; ".join(f"{seg} ({who}) has no counterpart and is not patched" for seg, who in self.unmatched)
        return (f"{len(self.heads)} heads patched one at a time at {len(self.clean_positions)} aligned positions; "
                f"largest changes of {self.metric}: {where}" + (f"; {alone}" if alone else ""))


def aligned_positions(clean, corrupted, segments: str | Sequence[str] | None = None
                      ) -> tuple[list[int], list[int], list[tuple[str, str]]]:
    """``(clean positions, corrupted positions, unmatched segments)``: positions paired token by token.

    Args:
        clean, corrupted: :class:`~lensprobe.core.prompts.prompt.Prompt` objects.
        segments: segment names to pair (``None``: every segment both prompts have).

    Raises:
        LensprobeError: token ids without segments, a segment of different lengths in the two
            prompts, or nothing to pair.

    Example:
        >>> clean_pos, corrupted_pos, alone = aligned_positions(with_filler, without)
        >>> alone
        [('filler', 'only the clean prompt')]
    """
    for name, p in (("clean", clean), ("corrupted", corrupted)):
        if not hasattr(p, "segments"):
            raise LensprobeError(f"the {name} prompt is token ids without named segments: build both prompts with "
                                 "lp.build_prompt so positions can be paired by segment.")
    unmatched = [(s, "only the clean prompt") for s in clean.segments if s not in corrupted.segments]
    unmatched += [(s, "only the corrupted prompt") for s in corrupted.segments if s not in clean.segments]
    names = [s for s in clean.segments if s in corrupted.segments] if segments is None else (
        [segments] if isinstance(segments, str) else list(segments))
    if segments is not None:
        unmatched += [(s, "not asked for") for s in clean.segments if s in corrupted.segments and s not in names]
    src: list[int] = []
    tgt: list[int] = []
    for name in names:
        a, b = segment_alignment(corrupted, clean, len(corrupted), len(clean), name)
        src += a
        tgt += b
    if not tgt:
        raise LensprobeError("the two prompts share no segment to pair: name segments=... both prompts have.")
    return tgt, src, unmatched


def aligned_source(model, corrupted, clean_len: int, clean_pos: list[int], corrupted_pos: list[int],
                    layers: list[int]) -> dict[int, Tensor]:
    """``{layer: [clean position, head, d_head]}``: the corrupted prompt's ``hook_z`` at the paired positions."""
    z = record_z(model, corrupted.tokens, layers)
    out = {}
    for layer in layers:
        values = z[layer][0]
        placed = torch.zeros(clean_len, *values.shape[1:], dtype=values.dtype, device=values.device)
        placed[clean_pos] = values[corrupted_pos]
        out[layer] = placed
    return out


def patch_heads(model, clean, corrupted, metric: Any = "entropy", *, heads: Any = "all",
                segments: str | Sequence[str] | None = None, answers: str | None = None,
                tokens: Sequence[int | str] | None = None, continuation: Any = None, batch_size: int = 32) -> HeadPatch:
    """Patch each head's output from ``corrupted`` into ``clean`` at the aligned positions, one head at a time.

    Args:
        model: a TransformerLens model.
        clean: the prompt measured (a :class:`~lensprobe.core.prompts.prompt.Prompt` or question).
        corrupted: the prompt the head outputs come from (any length: positions are paired by segment).
        metric, answers, tokens, continuation: as in :func:`~lensprobe.experiments.sweep.ablation_sweep`.
        heads: heads to patch (``"all"`` or any head spec).
        segments: segment names to pair (default: every segment both prompts have).
        batch_size: patched heads per forward.

    Returns:
        A :class:`HeadPatch`: ``.changes`` ``[1, head]`` (patched - clean), ``.top(k)``,
        ``.grid()`` for ``lp.viz.sweep_heatmap``, ``.unmatched``, ``.summary()``.

    Raises:
        LensprobeError: prompts without segments, segments of different lengths, bad heads or metric.

    Example:
        >>> res = lp.patch_heads(model, with_filler, without, "entropy")
        >>> print(res.summary())
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise LensprobeError(f"batch_size must be a positive integer, got {batch_size!r}.")
    clean_p, corrupted_p = as_prompts(model, clean, build_strings=True)[0], as_prompts(model, corrupted,
                                                                                     build_strings=True)[0]
    clean_pos, corrupted_pos, unmatched = aligned_positions(clean_p, corrupted_p, segments)
    pairs = sorted(resolve_heads(model, heads))
    if not pairs:
        raise LensprobeError("no heads to patch: pass heads='all' or a list of heads.")
    measure = resolve_measures(model, metric, 1, answers=answers, tokens=tokens, continuation=continuation)[0]
    source = aligned_source(model, corrupted_p, len(clean_p), clean_pos, corrupted_pos,
                             sorted({layer for layer, _ in pairs}))
    chunks = layer_chunks([None, *pairs], int(model.cfg.n_layers), batch_size)  # pairs are sorted: order kept
    flat, _ = sweep_prompt(model, clean_p, measure, chunks, "resample", Positions(fixed=frozenset(clean_pos)),
                           source, type(measure) in PREFIX_SAFE)
    return HeadPatch(pairs, flat[:1], flat[None, 1:], getattr(measure, "name", str(metric)), "patch",
                     int(model.cfg.n_layers), int(model.cfg.n_heads), tuple(clean_pos), tuple(corrupted_pos),
                     tuple(unmatched))
