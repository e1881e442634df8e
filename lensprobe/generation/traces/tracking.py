"""Tracked token sets of a generation: resolving ``track=`` specs and their position masks.

A tracked set is a prompt segment name, ``"prompt"``, ``"generated"``, ``"thinking"``, a
one-token string or a token id (every position holding it, so the set grows during
generation), or a callable ``fn(position, token_id) -> bool`` (see
:mod:`lensprobe.generation.loop`). Every spec is checked before a generation starts; the masks
are ``[row, padded position, set]`` floats that the attention recorders multiply by the
newest query's attention row.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.models.facts import ModelFacts
from lensprobe.core.prompts.prompt import Prompt

__all__ = ["SPECIAL_SETS", "TrackSpec", "TrackedSet", "add_position", "resolve_track", "set_masks"]

SPECIAL_SETS = ("prompt", "generated", "thinking")
"""Tracked-set names that need no prompt segment."""

TrackSpec = str | int | Callable[[int, int], bool]


@dataclass
class TrackedSet:
    name: str
    segment: str | None = None
    token_ids: frozenset = frozenset()
    prompt: bool = False
    generated: bool = False
    thinking: bool = False
    fn: Callable | None = None


def resolve_track(facts: ModelFacts, track, prompts: list[tuple[list[int], Prompt | None]],
                   think_id: int | None, has_thinking: bool) -> list[TrackedSet]:
    """The tracked sets ``track`` names (see :func:`lensprobe.generate`), checked against the prompts' segments and
    the model's vocabulary and tokenizer (from its ``facts``, read once by the run)."""
    if track is None:
        return []
    if isinstance(track, (str, int)) or callable(track):
        track = [track]
    if not isinstance(track, Mapping):
        track = {str(spec) if not callable(spec) else getattr(spec, "__name__", "callable"): spec for spec in track}
    segments = [set(p.segments) if p is not None else set() for _, p in prompts]
    common = set.intersection(*segments) if segments else set()
    out = []
    for name, spec in track.items():
        if not isinstance(name, str) or not name:
            raise LensprobeError(f"tracked set names must be non-empty strings, got {name!r}.")
        ts = TrackedSet(name)
        if isinstance(spec, bool):
            raise LensprobeError(f"tracked set {name!r}: {spec!r} is not a segment, token or callable.")
        if isinstance(spec, int):
            if not 0 <= spec < facts.d_vocab:
                raise LensprobeError(f"tracked set {name!r}: token id {spec} is outside the vocabulary.")
            ts.token_ids = frozenset([spec])
        elif isinstance(spec, str):
            if spec == "prompt":
                ts.prompt = True
            elif spec == "generated":
                ts.generated = True
            elif spec == "thinking":
                if think_id is None:
                    raise LensprobeError(
                        f"tracked set {name!r} = 'thinking' needs thinking=... (lp.generation.LatentFusion() or "
                        "lp.generation.Pause()) or a '<thinking>' token in the vocabulary (lp.generation.add_thinking_token)."
                    )
                ts.thinking = has_thinking
                ts.token_ids = frozenset([think_id])
            elif spec in common:
                ts.segment = spec
            else:
                ids = facts.tokenizer.encode(spec, add_special_tokens=False)
                if len(ids) == 1 and facts.tokenizer.decode(ids) == spec:
                    ts.token_ids = frozenset([int(ids[0])])
                else:
                    have = sorted(common)
                    missing = [i for i, s in enumerate(segments) if spec in s and spec not in common]
                    hint = (f" (only some prompts have it: it is missing from prompt(s) "
                            f"{[i for i, s in enumerate(segments) if spec not in s]})" if missing else "")
                    raise LensprobeError(
                        f"unknown tracked set {name!r} = {spec!r}{hint}: it is not a segment of the "
                        f"prompt(s) (segments: {have}), not one of {list(SPECIAL_SETS)}, and not a single "
                        f"token (it encodes as {len(ids)} tokens). Pass a segment name, a one-token string, "
                        "a token id, or a callable fn(position, token_id) -> bool."
                    )
        elif callable(spec):
            ts.fn = spec
        else:
            raise LensprobeError(
                f"tracked set {name!r}: {type(spec).__name__} is not a segment name, token, token id or callable."
            )
        out.append(ts)
    return out


def set_masks(items: list[tuple[list[int], Prompt | None]], sets: list[TrackedSet], row_prompts: list[int],
              padded: int, total: int, device) -> Tensor:
    """``[row, total, set]`` membership of the (left-padded, ``padded`` long) prompt positions.

    ``items`` are the prompts as ``(token ids, Prompt or None)``, ``row_prompts`` the prompt
    index of each row; generated positions (from ``padded`` on) are added by
    :func:`add_position` as the generation goes.
    """
    masks = torch.zeros((len(row_prompts), total, len(sets)), dtype=torch.float32, device=device)
    for r, pi in enumerate(row_prompts):
        seq, prompt = items[pi]
        off = padded - len(seq)
        for s, ts in enumerate(sets):
            member = [False] * len(seq)
            if ts.prompt:
                member = [True] * len(seq)
            elif ts.segment is not None:
                if prompt is None:  # resolve_track takes a segment only when every prompt has it
                    raise LensprobeError(f"tracked segment {ts.segment!r} needs Prompts: prompt {pi} is token ids.")
                start, end = prompt.segments[ts.segment]
                member = [start <= i < end for i in range(len(seq))]
            if ts.token_ids:
                member = [m or (t in ts.token_ids) for m, t in zip(member, seq, strict=True)]
            if ts.fn is not None:
                member = [m or bool(ts.fn(i, t)) for i, (m, t) in enumerate(zip(member, seq, strict=True))]
            masks[r, off:padded, s] = torch.tensor(member, dtype=torch.float32, device=device)
    return masks


def add_position(masks: Tensor, sets: list[TrackedSet], col: int, choice: Tensor, think: Tensor,
                  lengths: Tensor, t: int, active: Tensor) -> None:
    """Mark padded position ``col`` (the token chosen at step ``t``) in every tracked set."""
    ch = choice.tolist()
    th = think.tolist()
    for s, ts in enumerate(sets):
        if ts.generated:
            masks[:, col, s] = 1.0
            continue
        member = [False] * len(ch)
        if ts.token_ids:
            member = [c in ts.token_ids for c in ch]
        if ts.thinking:
            member = [m or k for m, k in zip(member, th, strict=True)]
        if ts.fn is not None:
            ln = lengths.tolist()
            member = [m or bool(ts.fn(ln[r] + t, ch[r])) for r, m in enumerate(member)]
        if any(member):
            masks[:, col, s] = torch.tensor(member, dtype=masks.dtype, device=masks.device)
