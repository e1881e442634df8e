"""Checking an attribution by exact ablation: the top candidates (and a random sample of the rest).

AtP* (Kramar et al. 2024) is a prefilter: the paper verifies the units it ranks highest by
exact patching, and samples the rest to bound the false negatives left. This module does
both with the batched sweep machinery of :mod:`lensprobe.experiments.sweep` (one forward
runs ``batch_size`` single-head ablations), under the attribution's own ablation settings.

Example:
    >>> att = lp.attribute_heads(model, prompts, "entropy", method="atp*")
    >>> ver = lp.verify_attribution(model, prompts, "entropy", att, top=20, sample=20)
    >>> ver.recall, ver.spearman, ver.misses
"""

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
from lensprobe.core.measures.measure import measure_once
from lensprobe.experiments.attribution import Attribution
from lensprobe.experiments.sweep import sweep_prompt
from lensprobe.interventions.ablation import HeadAblation

__all__ = ["Verification", "agreement", "verify_attribution"]


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
        spearman, spearman_abs, recall: :func:`agreement` over the verified units (recall at
            ``top``: a sampled unit whose exact effect beats a top candidate's is a miss).
        misses: the sampled units whose ``|exact|`` ranks among the ``top`` largest (false
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

    def summary(self) -> str:
        """One line: how many units were verified and how well the attribution agreed."""
        n = len(self.table)
        return (f"{self.method} on {self.metric}: {n} heads verified exactly ({self.top} top, {n - self.top} sampled); "
                f"Spearman {self.spearman:.3f} (|score| vs |exact| {self.spearman_abs:.3f}); "
                f"top-{self.top} recall {self.recall:.2f}; {len(self.misses)} missed")


def _exact_heads(model, items, measures, att: Attribution, chosen: list[int], batch_size: int) -> Tensor:
    """``[prompt, chosen]`` exact change per single-head ablation, with the sweep's batched forwards."""
    s = att.settings
    order = sorted(range(len(chosen)), key=lambda j: att.units[chosen[j]])
    rows = [None, *((att.units[chosen[j]][0], att.units[chosen[j]][1][0]) for j in order)]
    chunks = [rows[i: i + batch_size] for i in range(0, len(rows), batch_size)]
    out = torch.empty(len(items), len(chosen), device="cpu")
    for p, (prompt, measure, source) in enumerate(zip(items, measures, s["sources"], strict=True)):
        pos = resolve_positions(s["positions"], prompt if hasattr(prompt, "positions") else None)
        flat, _ = sweep_prompt(model, prompt, measure, chunks, s["method"], pos, source, True)
        out[p, order] = flat[1:] - flat[0]
    return out


def _exact_groups(model, items, measures, att: Attribution, chosen: list[int]) -> Tensor:
    """``[prompt, chosen]`` exact change per KV-group ablation (one forward per group)."""
    s = att.settings
    out = torch.empty(len(items), len(chosen), device="cpu")
    for p, (prompt, measure) in enumerate(zip(items, measures, strict=True)):
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
                       sample: int = 0, seed: int = 0, batch_size: int = 32) -> Verification:
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

    Returns:
        A :class:`Verification`.

    Raises:
        LensprobeError: a different number of prompts, or ``top``/``sample`` out of range.

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
    exact = (_exact_heads(model, items, measures, attribution, chosen, batch_size) if attribution.unit == "head"
             else _exact_groups(model, items, measures, attribution, chosen)).mean(0)
    return _verification(attribution, chosen, top, exact)


def _verification(att: Attribution, chosen: list[int], top: int, exact: Tensor) -> Verification:
    table = att.table.iloc[chosen].reset_index(drop=True).drop(columns=["spread", "n_prompts"])
    table["exact"] = exact.tolist()
    table["error"] = table["estimate"] - table["exact"]
    table["chosen"] = ["top"] * top + ["sample"] * (len(chosen) - top)
    stats = agreement(torch.tensor(table["estimate"].values), torch.tensor(table["score"].values), exact, top)
    cut = exact.abs().sort(descending=True).values[min(top, len(chosen)) - 1]
    misses = table[(table["chosen"] == "sample") & (table["exact"].abs() >= float(cut))]
    misses = misses.reindex(misses["exact"].abs().sort_values(ascending=False).index).reset_index(drop=True)
    return Verification(table, top, stats["spearman"], stats["spearman_abs"], stats["recall"], misses,
                        att.method, att.metric)
