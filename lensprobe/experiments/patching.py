"""Activation patching: run a target prompt with activations copied from a source prompt.

Positions are aligned by segment name, so the two prompts may differ in length: patching
``segments="question"`` copies the source's question positions onto the target's
question positions, token by token (the segment must hold the same number of tokens in
both). Each patched site (hook point x segment) is measured on its own; all sites run as
rows of one batch, with the unpatched target as row 0.

**Sharding.** With ``out=folder`` every site is a unit of its own, run as a batch of two
rows (the unpatched target and the patched one), so it gives the same numbers whatever the
number of processes; the units are spread over the processes of a launcher (``torchrun``,
``accelerate launch``, ``srun``; see :mod:`lensprobe.core.storage.shards`), saved as soon as they are
computed, and skipped by a rerun.

Example: does the layer-0 output over the question carry the filler's effect?

    >>> with_filler = lp.build_prompt(model, q, system=s, filler=lp.Filler.meaningless())
    >>> without = lp.build_prompt(model, q, system=s)
    >>> res = lp.patch(model, with_filler, without, "blocks.0.hook_resid_post", segments="question")
    >>> res.to_dataframe()[["site", "clean", "patched", "change", "kl"]]
"""

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import ActivationRecorder, resolve_hooks
from lensprobe.core.lazy import pandas
from lensprobe.core.measures.forced import resolve_measures
from lensprobe.core.measures.measure import logits_needed, run_logits, run_measure
from lensprobe.core.storage.jsonable import prompt_ids_digest
from lensprobe.core.storage.runidentity import run_identity
from lensprobe.core.storage.shards import check_shard, run_sharded

__all__ = ["PatchHook", "PatchResult", "check_hook_names", "patch", "patch_hooks", "segment_alignment", "site_rows"]

_UNPATCHABLE = ("hook_pattern", "hook_attn_scores")


@dataclass(frozen=True)
class PatchHook:
    """Writes ``source[0, src_pos]`` into ``act[row, tgt_pos]`` for each ``(row, tgt_pos, src_pos)``."""
    name: str
    source: Tensor
    writes: tuple[tuple[int, Tensor, Tensor], ...]
    target_len: int

    def __call__(self, act: Tensor, hook) -> Tensor:
        if act.ndim < 2 or act.shape[1] != self.target_len:
            raise LensprobeError(
                f"cannot patch {self.name}: its activation has shape {tuple(act.shape)}, but patching needs "
                f"[batch, pos, ...] with pos = {self.target_len} (the target's length)."
            )
        out = act.clone()
        src = self.source.to(act.device, act.dtype)
        for row, tgt, srcp in self.writes:
            out[row, tgt.to(act.device)] = src[0, srcp.to(act.device)]
        return out


@dataclass
class PatchResult:
    """Metric per patched site. ``rows`` holds one dict per site (see :meth:`to_dataframe`)."""
    metric: str
    target_value: float
    source_value: float
    rows: list[dict[str, Any]]

    def to_dataframe(self):
        """One row per site: ``site``, ``hook``, ``segment``, ``n_positions``, ``clean``
        (target without patching), ``patched``, ``change`` (patched - clean), ``source`` (the
        metric on the source prompt), ``share`` (``change / (source - clean)``: the share of
        the source-target difference that patching the site carries over; NaN when the
        source and the clean target give the same value), ``kl`` (KL divergence, nats, from
        the clean target's next-token distribution at the last prompt position to the
        patched one)."""
        return pandas().DataFrame(self.rows, columns=["site", "hook", "segment", "n_positions", "clean", "patched",
                                                "change", "source", "share", "kl"])


def _positions_of(prompt, segment: str) -> list[int]:
    """Positions of a named segment; a clear error for token ids, which have no segments."""
    if not hasattr(prompt, "positions"):
        raise LensprobeError(
            f"segments={segment!r} needs Prompts with named segments (lp.build_prompt), not token ids."
        )
    return prompt.positions(segment)


def segment_alignment(source, target, src_len: int, tgt_len: int, segment: str | None) -> tuple[list[int], list[int]]:
    """``(source positions, target positions)`` of a segment (``None``: every position), token by token."""
    if segment is None:
        if src_len != tgt_len:
            raise LensprobeError(
                f"source has {src_len} tokens and target {tgt_len}: patching every position needs equal "
                "lengths. Pass segments='question' (or other segment names) to align by segment."
            )
        return list(range(src_len)), list(range(tgt_len))
    src, tgt = _positions_of(source, segment), _positions_of(target, segment)
    if len(src) != len(tgt):
        raise LensprobeError(
            f"segment {segment!r} has {len(src)} tokens in the source but {len(tgt)} in the target: "
            "patching copies token by token, so the segment must have the same length in both."
        )
    if not src:
        raise LensprobeError(f"segment {segment!r} is empty; pick a segment with tokens.")
    return src, tgt


def patch(model, source_prompt, target_prompt, hook_names: str | Sequence[str], *,
          segments: str | Sequence[str] | None = None, metric: Any = "entropy", answer: str | None = None,
          tokens: Sequence[int | str] | None = None, continuation: Any = None, combined: bool = True, out: str | os.PathLike | None = None, rank: int | None = None,
          world_size: int | None = None) -> PatchResult:
    """Run ``target_prompt`` with activations copied from ``source_prompt``; measure each site.

    Args:
        model: a TransformerLens model.
        source_prompt, target_prompt: :class:`~lensprobe.core.prompts.prompt.Prompt` objects (token ids
            work when ``segments`` is ``None`` and the lengths match).
        hook_names: hook point(s) to patch, e.g. ``"blocks.0.hook_resid_post"`` or
            ``["blocks.0.attn.hook_z", "blocks.0.hook_mlp_out"]``. Any hook whose activation is
            ``[batch, pos, ...]`` (not attention patterns).
        segments: segment name(s) to copy, aligned by name across the prompts; ``None``
            copies every position (equal lengths needed).
        metric: what to measure, a name of the one metric vocabulary
            (:func:`~lensprobe.core.measures.forced.resolve_measures`): ``"entropy"``, ``"logprob"`` with
            ``answer``, ``"logit_diff"`` with ``tokens``, ``"attention:<segment>"``, a measure or a callable.
        answer: the answer for ``"logprob"`` (appended to both prompts).
        tokens, continuation: the two tokens of ``"logit_diff"``; token ids fed after both prompts
            (``"entropy"``/``"logprob"`` over a teacher-forced continuation).
        combined: also report a row with every site patched at once (when there are
            several sites).
        out: a folder where each site's result is saved as soon as it is computed: a rerun
            skips it, and a sharded run's processes meet there (on a filesystem they all
            share). Each site then runs in its own two-row batch (see the module docs). A
            folder of a patching run with other settings is refused. ``None`` (default): all
            sites in one batch, nothing saved.
        rank, world_size: this process's shard; default from the environment
            (:func:`~lensprobe.core.storage.shards.shard_info`). Rank ``r`` computes every
            ``world_size``-th site from site ``r`` (the all-sites row last); with
            ``world_size > 1``, ``out`` is required.

    Returns:
        A :class:`PatchResult`; ``.to_dataframe()`` has one row per site (hook x segment)
        with the clean and patched metric, their difference and a KL divergence. In a
        sharded run, rank 0 waits for the other processes and returns every site, equal to
        a single-process run with ``out``; the other ranks return the rows of their sites.

    Raises:
        LensprobeError: unknown or unpatchable hooks, segments that do not align, a sharded
            run without ``out``, a folder of another run, or other ranks that stop finishing sites.

    Example:
        >>> res = lp.patch(model, with_filler, without, "blocks.0.hook_resid_post", segments="question")
    """
    names = check_hook_names(model, hook_names)
    rank, world_size = check_shard(rank, world_size, out)
    segs: list[str | None] = [None] if segments is None else (
        [segments] if isinstance(segments, str) else list(segments))
    [measure] = resolve_measures(model, metric, 1, answers=answer, tokens=tokens, continuation=continuation)
    src_tokens = measure.inputs(model, source_prompt)
    tgt_tokens = measure.inputs(model, target_prompt)
    S, T = src_tokens.shape[1], tgt_tokens.shape[1]
    alignment = {seg: segment_alignment(source_prompt, target_prompt, S, T, seg) for seg in segs}

    rec = ActivationRecorder(names)
    source_value = float(run_measure(model, measure, source_prompt, src_tokens, rec)[0][0])

    sites = [(name, seg) for name in names for seg in segs]
    row_groups = [[site] for site in sites] + ([sites] if combined and len(sites) > 1 else [])
    groups = {f"{i}: " + (f"{g[0][0]} @ {g[0][1] or 'all positions'}" if len(g) == 1 else "all sites"): g
              for i, g in enumerate(row_groups)}
    label = getattr(measure, "name", str(metric))

    def run(row_sites: list[list[tuple[str, str | None]]]) -> tuple[Tensor, Tensor]:
        return _measure_rows(model, measure, target_prompt, tgt_tokens, rec.acts, names, row_sites, alignment)

    if out is None:
        row_sites = [[], *row_groups]
        values, kl = run(row_sites)
        return PatchResult(label, float(values[0]), source_value, site_rows(row_sites, alignment, values, kl,
                                                                               source_value))

    def compute(unit: str) -> dict[str, float]:
        values, kl = run([[], groups[unit]])
        return {"clean": float(values[0]), "patched": float(values[1]), "kl": float(kl[1])}

    settings = run_identity(model, source=source_prompt, target=target_prompt, sites=list(groups), metric=metric,
                            answer=answer, tokens=tokens, continuation=continuation)
    both = prompt_ids_digest(src_tokens, tgt_tokens)
    got = run_sharded(list(groups), compute, out=out, kind="patch", settings=settings, rank=rank,
                      world_size=world_size, ids=dict.fromkeys(groups, both))
    clean = next((r["clean"] for r in got.values()), float("nan"))
    values = torch.tensor([clean, *(r["patched"] for r in got.values())], device="cpu")
    kl = torch.tensor([0.0, *(r["kl"] for r in got.values())], device="cpu")
    row_sites = [[], *(groups[unit] for unit in got)]
    return PatchResult(label, float(values[0]), source_value, site_rows(row_sites, alignment, values, kl,
                                                                           source_value))


def _measure_rows(model, measure, target_prompt, tgt_tokens: Tensor, source_acts: dict[str, Tensor],
                  names: list[str], row_sites: list[list[tuple[str, str | None]]], alignment: dict
                  ) -> tuple[Tensor, Tensor]:
    """The measure and the KL divergence from row 0 for one batch of the target, row ``r``
    patched at the sites ``row_sites[r]`` (row 0: no site, the clean target)."""
    T = tgt_tokens.shape[1]
    hooks = patch_hooks(names, source_acts, row_sites, alignment, T)
    batch = tgt_tokens.expand(len(row_sites), -1)
    n_prompt = int(target_prompt.tokens.shape[1] if hasattr(target_prompt, "tokens") else T)
    keep = max(logits_needed(measure, model, target_prompt), T - n_prompt + 1)
    recs = measure.recorders(model, target_prompt)
    logits = run_logits(model, batch, keep if logits_needed(measure, model, target_prompt) else 0, *hooks, *recs)
    values = measure.compute(logits, batch, target_prompt, recs).float().cpu()

    last = n_prompt - 1 - (T - logits.shape[1])  # the last prompt position among the kept logits
    logp = torch.log_softmax(logits[:, last].float(), dim=-1)
    kl = (logp[0].exp() * (logp[0] - logp)).sum(-1).cpu()
    return values, kl


def check_hook_names(model, hook_names: str | Sequence[str]) -> list[str]:
    """The hook names as a list, each existing on ``model``, none twice, none an attention pattern."""
    names = [hook_names] if isinstance(hook_names, str) else list(hook_names)
    if not names:
        raise LensprobeError("no hook names given: pass e.g. 'blocks.0.hook_resid_post'.")
    for name in names:
        if name.endswith(_UNPATCHABLE):
            raise LensprobeError(
                f"cannot patch {name}: attention patterns have two position axes. Patch the head "
                "outputs ('blocks.{l}.attn.hook_z') or values ('hook_v') instead."
            )
    if len(set(names)) != len(names):
        raise LensprobeError("a hook name is given twice; name each hook point once.")
    resolve_hooks(model, [(n, lambda a, h: None) for n in names])
    return names


def patch_hooks(names: list[str], source_acts: dict[str, Tensor], row_sites: list[list[tuple[str, str | None]]],
                alignment: dict, target_len: int) -> list[tuple[str, PatchHook]]:
    """One :class:`PatchHook` per hook point of ``names`` (its source activation from
    ``source_acts``): batch row ``r`` gets the sites ``row_sites[r]``."""
    writes: dict[str, list[tuple[int, Tensor, Tensor]]] = {name: [] for name in names}
    for row, group in enumerate(row_sites):
        for name, seg in group:
            src_pos, tgt_pos = alignment[seg]
            writes[name].append((row, torch.tensor(tgt_pos, device="cpu"), torch.tensor(src_pos, device="cpu")))
    return [(name, PatchHook(name, source_acts[name], tuple(w), target_len)) for name, w in writes.items() if w]


def site_rows(row_sites: list[list[tuple[str, str | None]]], alignment: dict, values: Tensor, kl: Tensor,
              source_value: float) -> list[dict[str, Any]]:
    """The rows of :meth:`PatchResult.to_dataframe`, one per patched batch row (row 0 is the clean target)."""
    rows = []
    gap = source_value - float(values[0])
    for row, group in enumerate(row_sites[1:], start=1):
        if len(group) == 1:
            name, seg = group[0]
            site = f"{name} @ {seg or 'all positions'}"
            hook_col, seg_col, n_pos = name, seg or "all", len(alignment[seg][1])
        else:
            site, hook_col, seg_col = "all sites", "all", "all"
            n_pos = sum(len(alignment[seg][1]) for _, seg in group)
        rows.append({
            "site": site, "hook": hook_col, "segment": seg_col, "n_positions": n_pos,
            "clean": float(values[0]), "patched": float(values[row]),
            "change": float(values[row] - values[0]), "source": source_value,
            "share": float(values[row] - values[0]) / gap if gap != 0 else float("nan"), "kl": float(kl[row]),
        })
    return rows
