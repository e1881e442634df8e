"""Per-head activation patching across prompts of different lengths: :func:`patch_heads`.

``lp.patch`` patches whole hook points; :func:`patch_heads` patches one attention head at a
time: head ``h``'s output (``hook_z``) on the ``clean`` prompt is replaced, at every aligned
position, by its output on the ``corrupted`` prompt, and the metric's change is measured, one
exact run per head, batched as the ablation sweep batches (rows sorted by layer, the forward
below the lowest patched head shared). One pair of prompts or many: each pair is patched on its
own, and the result (:class:`~lensprobe.experiments.headpatch_result.HeadPatch`) keeps the changes
per pair and their mean, the clean and corrupted metrics per pair, and each head's share of the
total effect ``corrupted - clean``.

**Alignment by segment.** The two prompts may differ in length. Positions are paired token by
token within named segments (``lp.build_prompt``'s ``system``, ``question``, ``answer`` ...):
by default every segment both prompts have, in order, so a prompt with the meaningless filler
and the same prompt without it pair every position except the filler's (and its separator); a
segment only one prompt has has no counterpart: it is never patched, and the result says so
(``HeadPatch.unmatched``). ``segments=[...]`` patches the named segments only.

Which heads carry the filler's effect on the next-token entropy: the clean prompt is the one
with the filler, the corrupted one the same question without it; a head whose patched output
moves the entropy back carries part of the filler's effect at the positions both prompts share.
``filler="w/ Mless"`` builds both prompts of each question or MATH-500 problem with the
condition's prompt builder (:func:`filler_pairs`).

Example:
    >>> with_filler = lp.build_prompt(model, q, system=lp.MATH_SYSTEM_PROMPT, filler=lp.Filler.meaningless())
    >>> without = lp.build_prompt(model, q, system=lp.MATH_SYSTEM_PROMPT)
    >>> res = lp.patch_heads(model, with_filler, without, "entropy")
    >>> res.top(5), res.unmatched
    >>> many = lp.patch_heads(model, lp.load_math500(limit=3), filler="w/ Mless")
    >>> many.mean_changes, many.shares          # [head], [pair, head]
"""

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.forward import as_prompts
from lensprobe.core.hooks.heads import Positions, resolve_heads
from lensprobe.core.measures.forced import resolve_measures
from lensprobe.core.measures.measure import measure_once
from lensprobe.core.progress import tqdm
from lensprobe.core.prompts.conditions import resolve_conditions
from lensprobe.core.prompts.prompt import Prompt
from lensprobe.experiments.headpatch_result import HeadPatch
from lensprobe.experiments.patching import segment_alignment
from lensprobe.experiments.sweep import PREFIX_SAFE, layer_chunks, sweep_prompt
from lensprobe.interventions.replacement import record_z

__all__ = ["HeadPatch", "aligned_positions", "aligned_source", "filler_pairs", "patch_heads"]


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


def _as_list(items) -> list:
    """One item or a list of them, as a list (a list of token ids is one item)."""
    if isinstance(items, (list, tuple)) and items and not all(isinstance(i, int) for i in items):
        return list(items)
    return [items]


def _question_of(item) -> str:
    """A question string, or a problem's (anything with a ``problem`` text, e.g. a MATH-500 problem)."""
    text = item if isinstance(item, str) else getattr(item, "problem", None)
    if not isinstance(text, str):
        raise LensprobeError(f"with filler=, each item is a question string or a problem with a .problem text "
                             f"(lp.load_math500), got {type(item).__name__}.")
    return text


def filler_pairs(model, questions, filler) -> tuple[list[Prompt], list[Prompt], list[str] | None]:
    """``(clean, corrupted, answers)``: each question (or problem) built under the condition ``filler`` and under
    the same condition without its filler; the problems' answers when every item has one, else ``None``.

    Raises:
        LensprobeError: not one condition, a condition with no filler, its own builder or interventions.

    Example:
        >>> clean, corrupted, answers = filler_pairs(model, lp.load_math500(limit=3), "w/ Mless")
    """
    conds = resolve_conditions(filler)
    if len(conds) != 1:
        raise LensprobeError(f"filler= names one condition (e.g. 'w/ Mless'), got {len(conds)}: {[c.name for c in conds]}.")
    cond = conds[0]
    if cond.build is not None or cond.interventions or cond.generate_kwargs:
        raise LensprobeError(f"condition {cond.name!r} builds its own prompts or attaches interventions: patch_heads "
                             "cannot remove its filler; build the two prompts yourself and pass clean and corrupted.")
    if cond.filler is None:
        raise LensprobeError(f"condition {cond.name!r} has no filler: nothing differs between the two prompts; "
                             "use e.g. filler='w/ Mless'.")
    items = _as_list(questions)
    texts = [_question_of(q) for q in items]
    with_filler, without = cond.prompt_builder(model), replace(cond, filler=None).prompt_builder(model)
    answers = [getattr(q, "answer", None) for q in items]
    found = [str(a) for a in answers] if all(isinstance(a, str) and a for a in answers) else None
    return [with_filler(t) for t in texts], [without(t) for t in texts], found


def patch_heads(model, clean, corrupted: Any = None, metric: Any = "entropy", *, filler: Any = None, heads: Any = "all",
                segments: str | Sequence[str] | None = None, answers: str | Sequence[str] | None = None,
                tokens: Sequence[int | str] | None = None, continuation: Any = None, batch_size: int = 32,
                progress: bool = False) -> HeadPatch:
    """Patch each head's output from each corrupted prompt into its clean prompt at the aligned positions, one
    head at a time, over one pair or many.

    Args:
        model: a TransformerLens model.
        clean: the prompt measured (a :class:`~lensprobe.core.prompts.prompt.Prompt` or question), or a list of
            them; with ``filler``: questions or problems (``lp.load_math500(...)``).
        corrupted: the prompt the head outputs come from (any length: positions are paired by segment), or a
            list, one per clean prompt. Leave it out with ``filler``.
        metric, answers, tokens, continuation: as in :func:`~lensprobe.experiments.sweep.ablation_sweep`;
            ``metric="logprob"`` with problems and no ``answers`` reads each problem's ``answer``.
        filler: a condition name or :class:`~lensprobe.core.prompts.conditions.Condition` with a filler
            (``"w/ Mless"``): each clean prompt is the question under it, each corrupted prompt the same
            without its filler (:func:`filler_pairs`).
        heads: heads to patch (``"all"`` or any head spec).
        segments: segment names to pair (default: every segment both prompts have).
        batch_size: patched heads per forward.
        progress: show a progress bar.

    Returns:
        A :class:`~lensprobe.experiments.headpatch_result.HeadPatch`: ``.changes`` ``[pair, head]`` (patched -
        clean) and ``.mean_changes``, ``.clean``, ``.corrupted`` and ``.patched`` metrics, ``.shares`` (of the
        total effect, ``(patched - clean) / (corrupted - clean)``), ``.top(k)``, ``.grid()`` for
        :func:`~lensprobe.viz.ablation.sweep_heatmap`, ``.unmatched``, ``.summary()``.

    Raises:
        LensprobeError: prompts without segments, segments of different lengths, lists of different lengths,
            bad heads, metric or filler; all before the first forward.

    Example:
        >>> res = lp.patch_heads(model, with_filler, without, "entropy")
        >>> res = lp.patch_heads(model, lp.load_math500(limit=3), filler="w/ Mless", metric="logprob")
        >>> print(res.summary())
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise LensprobeError(f"batch_size must be a positive integer, got {batch_size!r}.")
    clean_ps: list[Any]
    corrupted_ps: list[Any]
    if filler is not None:
        if corrupted is not None:
            raise LensprobeError("pass corrupted prompts or filler=, not both: filler= builds each corrupted prompt "
                                 "as the clean one without its filler.")
        clean_ps, corrupted_ps, found = filler_pairs(model, clean, filler)
        answers = found if answers is None and metric == "logprob" else answers
    elif corrupted is None:
        raise LensprobeError("patch_heads needs the corrupted prompts (one per clean prompt), or filler='w/ Mless' "
                             "to build each pair from a question.")
    else:
        clean_ps = [as_prompts(model, p, build_strings=True)[0] for p in _as_list(clean)]
        corrupted_ps = [as_prompts(model, p, build_strings=True)[0] for p in _as_list(corrupted)]
    if len(clean_ps) != len(corrupted_ps):
        raise LensprobeError(f"{len(clean_ps)} clean prompts but {len(corrupted_ps)} corrupted ones: give one "
                             "corrupted prompt per clean prompt (pairs).")
    aligned = [aligned_positions(c, k, segments) for c, k in zip(clean_ps, corrupted_ps, strict=True)]
    pairs = sorted(resolve_heads(model, heads))
    if not pairs:
        raise LensprobeError("no heads to patch: pass heads='all' or a list of heads.")
    measures = resolve_measures(model, metric, len(clean_ps), answers=answers, tokens=tokens,
                                continuation=continuation)
    return _run(model, clean_ps, corrupted_ps, aligned, pairs, measures, batch_size, progress,
                getattr(measures[0], "name", str(metric)))


def _corrupted_metric(model, measure, prompt) -> float:
    """The metric on the corrupted prompt; NaN where it is not defined there (e.g. attention onto a segment
    only the clean prompt has)."""
    try:
        return float(measure_once(model, measure, prompt)[0])
    except LensprobeError:
        return float("nan")


def _run(model, clean_ps, corrupted_ps, aligned, pairs, measures, batch_size: int, progress: bool,
         name: str) -> HeadPatch:
    """Every pair's patched run per head (the sweep's batches and shared prefix), and its corrupted metric."""
    layers = sorted({layer for layer, _ in pairs})
    chunks = layer_chunks([None, *pairs], int(model.cfg.n_layers), batch_size)  # pairs are sorted: order kept
    share = type(measures[0]) in PREFIX_SAFE
    rows, corrupted = [], []
    with tqdm(total=len(clean_ps) * len(chunks), desc="head patching", disable=not progress) as bar:
        for clean_p, corrupted_p, (clean_pos, corrupted_pos, _), measure in zip(
                clean_ps, corrupted_ps, aligned, measures, strict=True):
            corrupted.append(_corrupted_metric(model, measure, corrupted_p))
            source = aligned_source(model, corrupted_p, len(clean_p), clean_pos, corrupted_pos, layers)
            flat, share = sweep_prompt(model, clean_p, measure, chunks, "resample",
                                       Positions(fixed=frozenset(clean_pos)), source, share, bar)
            rows.append(flat.cpu())
    values = torch.stack(rows)
    return HeadPatch(pairs, values[:, 0], values[:, 1:], name, "patch", int(model.cfg.n_layers),
                     int(model.cfg.n_heads), torch.tensor(corrupted, dtype=values.dtype),
                     tuple((tuple(c), tuple(k)) for c, k, _ in aligned),
                     tuple(tuple(u) for _, _, u in aligned))
