"""Checking an attribution by exact ablation: the top candidates (and a random sample of the rest).

AtP* (Kramar et al. 2024) is a prefilter: the paper verifies the units it ranks highest by
exact patching, and samples the rest to bound the false negatives left. This module does
both with the batched sweep machinery of :mod:`lensprobe.experiments.sweep` (one forward
runs ``batch_size`` single-head ablations), under the attribution's own ablation settings.

Example:
    >>> att = lp.attribute_heads(model, prompts, "entropy", method="atp*")
    >>> ver = lp.verify_attribution(model, prompts, "entropy", att, top=20, sample=20)
    >>> ver.recall, ver.recall_kind, ver.spearman, ver.misses

Recall is stated only where it can be known: exact when every head was verified (``top=None``,
or a sample covering the rest), an estimated lower bound with its 95% interval from a random
sample of the heads outside the top, and "not measured" without one (:meth:`Verification.recall_text`):
the top candidates alone always agree with themselves, so their recall would hold by construction.
"""

import math
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.forward import as_prompts
from lensprobe.core.hooks.heads import resolve_positions
from lensprobe.core.lazy import pandas
from lensprobe.core.measures.forced import resolve_measures
from lensprobe.core.measures.intervals import wilson_interval
from lensprobe.core.measures.measure import measure_once
from lensprobe.core.progress import tqdm
from lensprobe.experiments.attribution import Attribution, computed_on, prompt_positions
from lensprobe.experiments.sweep import sweep_prompt
from lensprobe.interventions.ablation import HeadAblation

__all__ = ["Verification", "agreement", "recall_bound", "verify_attribution"]


def _spearman(a: Tensor, b: Tensor) -> float:
    """Spearman's rank correlation (ties get their average rank)."""
    if a.numel() < 3:
        return float("nan")
    ra = torch.tensor(pandas().Series(a.tolist()).rank().values, dtype=torch.float64)
    rb = torch.tensor(pandas().Series(b.tolist()).rank().values, dtype=torch.float64)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / denom if denom > 0 else float("nan")


def agreement(estimate: Float[Tensor, " unit"], score: Float[Tensor, " unit"], exact: Float[Tensor, " unit"],
              k: int) -> dict[str, float]:
    """How well an attribution agrees with exact effects over the same units.

    Returns ``spearman`` (rank correlation of the signed estimate with the exact change),
    ``spearman_abs`` (of the ranking score with ``|exact|``) and ``recall`` (the share of the
    ``k`` units with the largest ``|exact|`` that are among the ``k`` highest scores).

    Example:
        >>> agreement(torch.tensor([1., -2, 3]), torch.tensor([1., 2, 3]), torch.tensor([1., -2, 2.5]), 2)
        {'spearman': 1.0, 'spearman_abs': 1.0, 'recall': 1.0}
    """
    k = min(k, exact.numel())
    if k < 1:
        raise LensprobeError("recall needs k >= 1 and at least one unit.")
    picked = set(torch.argsort(score, descending=True, stable=True)[:k].tolist())
    truth = set(torch.argsort(exact.abs(), descending=True, stable=True)[:k].tolist())
    return {"spearman": _spearman(estimate, exact), "spearman_abs": _spearman(score, exact.abs()),
            "recall": len(picked & truth) / k}


@dataclass
class Verification:
    """Estimates beside exact ablation effects for the verified units.

    Attributes:
        table: one row per verified unit: ``layer``, ``head`` (``kv_head``), ``head_label``,
            ``estimate``, ``score``, ``exact`` (mean over prompts of the exact change),
            ``error`` (``estimate - exact``), ``chosen`` (``"top"`` or ``"sample"``).
        top: how many units were verified as top candidates.
        spearman, spearman_abs: :func:`agreement`'s correlations over the verified units.
        recall: top-``top`` recall (the share of the true ``top`` largest ``|exact|`` among the
            ``top`` candidates), only where it can be known; see ``recall_kind``.
        recall_kind: ``"exact"`` (every unit was verified: the true top is known), ``"sampled"``
            (``recall`` is an estimate of a lower bound from a random sample of the other units, with
            ``recall_low``/``recall_high``, its 95% interval), or ``"unknown"`` (no unit outside the
            top was checked: ``recall`` is ``nan``; nothing can be said about the heads not checked).
        recall_low, recall_high: the 95% interval of a sampled estimate (``nan`` otherwise).
        outside: units outside the top candidates; ``sampled``: how many of them were verified.
        beat: verified units outside the top whose ``|exact|`` exceeds the weakest top candidate's.
        misses: the sampled units whose ``|exact|`` ranks among the ``top`` largest verified (false
            negatives of the attribution), largest first.
        method, metric: of the attribution.
    """

    table: Any
    top: int
    spearman: float
    spearman_abs: float
    recall: float
    misses: Any
    method: str
    metric: str
    recall_kind: str = "exact"
    recall_low: float = math.nan
    recall_high: float = math.nan
    outside: int = 0
    sampled: int = 0
    beat: int = 0

    def recall_text(self) -> str:
        """What is known of the top-k recall, in words (what the summary line says)."""
        k = self.top
        if self.recall_kind == "exact":
            return f"top-{k} recall {self.recall:.2f} (exact: every head verified)"
        if self.recall_kind == "unknown":
            return (f"top-{k} recall not measured: none of the {self.outside} heads outside the top {k} was checked "
                    "(sample=N estimates it; top=None verifies every head)")
        return (f"top-{k} recall >= {self.recall:.2f} estimated (95% interval {self.recall_low:.2f}-"
                f"{self.recall_high:.2f}) from {self.sampled} random heads of the {self.outside} outside the top "
                f"{k}, {self.beat} of which beat a top candidate")

    def summary(self) -> str:
        """One line: how many units were verified, how well the attribution agreed, and what is known of
        its recall (:meth:`recall_text`)."""
        n = len(self.table)
        return (f"{self.method} on {self.metric}: {n} heads verified exactly ({self.top} top, {n - self.top} sampled); "
                f"Spearman {self.spearman:.3f} (|score| vs |exact| {self.spearman_abs:.3f}); "
                f"{self.recall_text()}; {len(self.misses)} missed")


def _exact_heads(model, items, measures, att: Attribution, chosen: list[int], batch_size: int, progress: bool
                 ) -> Tensor:
    """``[prompt, chosen]`` exact change per single-head ablation, with the sweep's batched forwards."""
    s = att.settings
    order = sorted(range(len(chosen)), key=lambda j: att.units[chosen[j]])
    rows = [None, *((att.units[chosen[j]][0], att.units[chosen[j]][1][0]) for j in order)]
    chunks = [rows[i: i + batch_size] for i in range(0, len(rows), batch_size)]
    out = torch.empty(len(items), len(chosen), device="cpu")
    with tqdm(total=len(items) * len(chunks), desc="verification", unit="batch", disable=not progress,
              leave=False) as bar:
        for p, (prompt, measure, source) in enumerate(zip(items, measures, s["sources"], strict=True)):
            pos = prompt_positions(s, p, prompt)
            flat, _ = sweep_prompt(model, prompt, measure, chunks, s["method"], pos, source, True, bar)
            out[p, order] = flat[1:] - flat[0]
    return out


def _exact_groups(model, items, measures, att: Attribution, chosen: list[int], progress: bool) -> Tensor:
    """``[prompt, chosen]`` exact change per KV-group ablation (one forward per group)."""
    s = att.settings
    out = torch.empty(len(items), len(chosen), device="cpu")
    for p, (prompt, measure) in enumerate(tqdm(list(zip(items, measures, strict=True)), desc="verification",
                                               unit="prompt", disable=not progress, leave=False)):
        reference = s["reference"] if isinstance(s["ablation"], str) else as_prompts(model, s["ablation"],
                                                                                    build_strings=True)[p]
        pos = resolve_positions(s["positions"], prompt if hasattr(prompt, "positions") else None)
        base = measure_once(model, measure, prompt)
        for j, i in enumerate(chosen):
            layer, heads = att.units[i]
            group = ((layer, heads[0] // att.group_size),)
            abl = HeadAblation((), s["method"], pos, reference, s["per_position"], kv_groups=group)
            out[p, j] = measure_once(model, measure, prompt, abl) - base
    return out


def verify_attribution(model, prompts, metric: Any, attribution: Attribution, *, top: int | None = 20,
                       sample: int = 0, seed: int = 0, batch_size: int = 32, progress: bool = False
                       ) -> Verification:
    """Ablate the attribution's top candidates exactly (and a random sample of the rest) and compare.

    The exact effects come from the batched ablation sweep under the attribution's own
    settings (method, reference or corrupted prompts, positions, answers, continuation), so
    estimate and exact value measure the same ablation.

    Args:
        model: the model the attribution was computed on.
        prompts: the same prompts (in the same order).
        metric: the same metric (as :func:`~lensprobe.experiments.attribution.attribute_heads` takes it).
        attribution: an :class:`~lensprobe.experiments.attribution.Attribution`.
        top: how many of the highest-scoring units to verify (``None``: every unit).
        sample: how many of the other units to verify too, drawn at random (the paper's
            diagnostic for false negatives).
        seed: the random draw's seed.
        batch_size: single-head ablations per forward pass.
        progress: show a progress bar of the exact ablations (one step per batched forward pass).

    Returns:
        A :class:`Verification`.

    Raises:
        LensprobeError: another model, other prompts or another metric than the attribution's
            (compared by content), or ``top``/``sample`` out of range.

    Example:
        >>> ver = lp.verify_attribution(model, prompts, "entropy", att, top=20, sample=20)
        >>> print(ver.summary())
    """
    items = as_prompts(model, prompts, build_strings=True)
    if len(items) != attribution.estimates.shape[0]:
        raise LensprobeError(
            f"the attribution was computed on {attribution.estimates.shape[0]} prompts but {len(items)} were given: "
            "pass the same prompts."
        )
    _check_same_run(model, items, metric, attribution)
    n = len(attribution.units)
    top = n if top is None else top
    if not isinstance(top, int) or not 1 <= top <= n or not isinstance(sample, int) or sample < 0:
        raise LensprobeError(f"top must be 1..{n} (or None for every unit) and sample >= 0, got {top!r}, {sample!r}.")
    score = attribution.scores.mean(0)
    order = torch.argsort(score, descending=True, stable=True).tolist()
    rest = order[top:]
    pick = torch.randperm(len(rest), generator=torch.Generator().manual_seed(seed))[:sample].tolist()
    chosen = order[:top] + [rest[i] for i in sorted(pick)]
    s = attribution.settings
    measures = resolve_measures(model, metric, len(items), answers=s["answers"], tokens=s["tokens"],
                                continuation=s["continuation"])
    exact = (_exact_heads(model, items, measures, attribution, chosen, batch_size, progress)
             if attribution.unit == "head" else _exact_groups(model, items, measures, attribution, chosen, progress)
             ).mean(0)
    return _verification(attribution, chosen, top, exact)


def _check_same_run(model, items, metric: Any, att: Attribution) -> None:
    """Refuse to verify an attribution with another model, other prompts or another metric than it was
    computed on: the exact values would measure something else than its estimates."""
    s = att.settings
    recorded = s.get("computed_on")
    if recorded is None:
        return  # an Attribution built by hand: nothing recorded to compare
    given = computed_on(model, items, metric, s["answers"], s["tokens"], s["continuation"])
    differ = [name for name in ("model", "prompts", "metric") if given[name] != recorded[name]]
    if differ:
        raise LensprobeError(
            f"the {' and '.join(differ)} given here {'differs' if differ in (['model'], ['metric']) else 'differ'} from "
            "the attribution's "
            "(compared by content): "
            "its estimates and the exact ablations would measure different things. Pass the model, prompts and "
            "metric of the attribution (or attribute again on these).")


def _verification(att: Attribution, chosen: list[int], top: int, exact: Tensor) -> Verification:
    table = att.table.iloc[chosen].reset_index(drop=True).drop(columns=["spread", "n_prompts"])
    table["exact"] = exact.tolist()
    table["error"] = table["estimate"] - table["exact"]
    table["chosen"] = ["top"] * top + ["sample"] * (len(chosen) - top)
    stats = agreement(torch.tensor(table["estimate"].values), torch.tensor(table["score"].values), exact, top)
    cut = exact.abs().sort(descending=True).values[min(top, len(chosen)) - 1]
    misses = table[(table["chosen"] == "sample") & (table["exact"].abs() >= float(cut))]
    misses = misses.reindex(misses["exact"].abs().sort_values(ascending=False).index).reset_index(drop=True)
    outside, sampled = len(att.units) - top, len(chosen) - top
    weakest = float(exact[:top].abs().min())
    beat = int((exact[top:].abs() > weakest).sum())
    recall, low, high, kind = recall_bound(stats["recall"], top, outside, sampled, beat)
    return Verification(table, top, stats["spearman"], stats["spearman_abs"], recall, misses, att.method, att.metric,
                        recall_kind=kind, recall_low=low, recall_high=high, outside=outside, sampled=sampled,
                        beat=beat)


def recall_bound(verified: float, top: int, outside: int, sampled: int, beat: int) -> tuple[float, float, float, str]:
    """``(recall, low, high, kind)``: exact when every unit was verified; from a random sample of the
    ``outside`` units otherwise. A unit outside the top that beats the weakest top candidate can
    push at most one candidate out of the true top, so with ``F`` such units the recall is at least
    ``1 - F / top``; ``F`` is estimated as the sampled share times ``outside`` (Wilson interval)."""
    if sampled == outside:
        return verified, math.nan, math.nan, "exact"
    if sampled == 0:
        return math.nan, math.nan, math.nan, "unknown"
    lo, hi = wilson_interval(beat, sampled)

    def bound(share: float) -> float:
        return min(1.0, max(0.0, 1 - share * outside / top))

    return bound(beat / sampled), bound(hi), bound(lo), "sampled"
