"""What :func:`~lensprobe.experiments.findheads.find_heads` returns: :class:`HeadSearch`, the heads found with
their exact effects, what the search cost and what it can say about its recall (:data:`RECALL_WIDTH`).

Example:
    >>> found = lp.find_heads(model, prompts, top=5)
    >>> found.summary()  # doctest: +SKIP
"""

import math
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from lensprobe.core.lazy import pandas
from lensprobe.experiments.attribution import Attribution

__all__ = ["RECALL_WIDTH", "HeadSearch", "stated_recall"]

RECALL_WIDTH = 0.3
"""The widest 95% interval of the recall bound that :meth:`HeadSearch.summary` states; a wider one is
reported as "recall not known"."""


@dataclass
class HeadSearch:
    """What :func:`~lensprobe.experiments.findheads.find_heads` found and what it cost.

    Attributes:
        table: one row per head ablated exactly: ``layer``, ``head``, ``head_label``, ``estimate``
            (AtP, mean over the prompts it was ablated on; NaN when the sweep ran instead) and ``score``
            (AtP's, mean over prompts), ``write`` (the flag signal, the largest over prompts), ``exact``
            (mean of the exact change over the ``prompts`` it was ablated on), ``prompts``, ``why``
            (``"flagged"``, ``"verified"``, ``"sampled"``, ``"per prompt"``: ablated on some prompts only, in
            step 5, or ``"swept"``: the sweep ran instead), ``atp_rank`` (1 = AtP's first), ``exact_rank``
            (1 = largest ``|exact|`` among the heads ablated on every prompt; empty for the others and for a
            head whose ablation made the metric NaN), ``nan_prompts`` (the prompts on which its ablation made
            the metric NaN: such a head is reported, never ranked). Heads ablated on every prompt come first.
        exact: ``[prompt, head]`` exact changes of the heads of ``table``, in its order (meaningful where
            ``ablated`` is true; NaN there only when the ablation made the metric NaN).
        ablated: ``[prompt, head]`` bool, whether the head of ``table`` was ablated on the prompt.
        top: how many heads were asked for.
        per_prompt: one list per prompt, in the prompts' order: the labels of the ``top`` heads with the
            largest ``|exact|`` on that prompt alone, largest first, among the heads ablated exactly on it
            (those ablated on every prompt, and those step 5 ablated on it alone). A head can be in a
            prompt's list and not in ``found`` (it matters there, not on average). Every value is exact;
            whether a prompt's list is its true top is known only where every head was ablated
            (``method="sweep"`` or ``recall_kind="exact"``). :meth:`per_prompt_table` gives them as a table
            with their exact changes.
        recall, recall_kind, recall_low, recall_high, outside, sampled, beat: what is known of the
            over-prompts top's recall. ``recall_kind``: ``"exact"`` (every head ablated: the top is the true
            top), ``"sampled"`` (the random check bounds it: ``recall_low`` is the 95% lower bound, stated
            only when ``recall_high - recall_low`` is below :data:`RECALL_WIDTH`) or ``"unknown"`` (no head
            checked, or an interval too wide to say anything; ``recall`` is then NaN, ``recall_low`` and
            ``recall_high`` the uninformative interval). ``outside``: heads not ablated before the last random
            check; ``sampled``: heads it drew; ``beat``: how many of them beat the weakest head found.
        cost: forward-equivalents per prompt (mean over prompts): ``"attribution"``, ``"flag"``,
            ``"exact"`` (of which ``"per_prompt"`` in step 5), ``"total"``, and for comparison
            ``"sweep"`` (every head, batched like the sweep) and ``"one_at_a_time"`` (the same exact
            heads, one forward each, plus the clean run).
        steps: verification steps run on every prompt (step 3).
        attribution: the AtP estimates (all NaN when the sweep ran instead: no AtP pass was run).
        metric: the metric's name.
        method: ``"search"`` (the pipeline) or ``"sweep"`` (the plan would cost at least the sweep, so every
            head was ablated exactly instead).
        planned: the estimate made before any forward, per prompt: ``"search"`` (the least the plan
            costs) and ``"sweep"``.
        capped: the search stopped because its next exact ablation would have cost more than the sweep.
        checks: rounds of the random check (more than one when ``recheck`` sent the search on).
    """

    table: Any
    exact: Tensor
    ablated: Tensor
    top: int
    per_prompt: list[list[str]]
    recall: float
    recall_kind: str
    recall_low: float
    recall_high: float
    outside: int
    sampled: int
    beat: int
    cost: dict[str, float]
    steps: int
    attribution: Attribution = field(repr=False)
    metric: str = ""
    method: str = "search"
    planned: dict[str, float] = field(default_factory=dict)
    capped: bool = False
    checks: int = 1

    @property
    def found(self):
        """The ``top`` heads with the largest ``|exact|`` (mean over prompts, among the heads ablated on
        every prompt), largest first."""
        ranked = self.table[self.table["exact_rank"].notna()]
        return ranked.sort_values("exact_rank", kind="stable").head(self.top).reset_index(drop=True)

    def per_prompt_table(self):
        """One row per prompt and rank: ``prompt``, ``rank`` (1 = largest ``|exact|`` there), ``head_label``,
        ``exact`` (the change on that prompt)."""
        column = {lbl: i for i, lbl in enumerate(self.table["head_label"])}
        return pandas().DataFrame([
            {"prompt": p, "rank": r + 1, "head_label": lbl, "exact": float(self.exact[p, column[lbl]])}
            for p, heads in enumerate(self.per_prompt) for r, lbl in enumerate(heads)])

    def recall_text(self) -> str:
        """What is known of the top-k recall, and nothing more: exact, a 95% lower bound when its interval is
        narrower than :data:`RECALL_WIDTH`, or "recall not known"."""
        k = self.top
        if self.recall_kind == "exact":
            return f"top-{k} exact (every head ablated)"
        if self.recall_kind == "sampled":
            return (f"top-{k} recall >= {self.recall_low:.2f} at 95% confidence (interval {self.recall_low:.2f}-"
                    f"{self.recall_high:.2f}, from {self.sampled} random heads of the {self.outside} not ablated, "
                    f"{self.beat} of which beat the weakest found)")
        if self.sampled == 0:
            return f"top-{k} recall not known (none of the {self.outside} heads left was checked)"
        return (f"top-{k} recall not known ({self.sampled} random heads of the {self.outside} not ablated, "
                f"{self.beat} of which beat the weakest found, cannot bound it: any value from "
                f"{self.recall_low:.2f} to {self.recall_high:.2f} fits)")

    def summary(self) -> str:
        """What was shown and nothing more: the heads found with their exact effects, what was ablated exactly,
        what it cost against the sweep (and whether the sweep ran instead), and what is known of recall."""
        c = self.cost
        found = self.found
        heads = ", ".join(f"{r.head_label} {r.exact:+.3g}" for r in found.itertuples())
        nan = list(self.table.loc[self.table["nan_prompts"] > 0, "head_label"])
        nan_text = f"; metric NaN when ablating {', '.join(nan)} (not ranked)" if nan else ""
        if self.method == "sweep":
            return (f"find_heads on {self.metric} ran the exact sweep instead (estimated {self.planned['search']:.1f} "
                    f"forward-equivalents per prompt for the search, {self.planned['sweep']:.1f} for the sweep): "
                    f"every one of the {len(self.table)} heads ablated exactly, {c['total']:.1f} forward-equivalents "
                    f"per prompt; exact top {len(found)}: {heads}{nan_text}")
        why = self.table["why"].value_counts()
        cap = "; stopped at the sweep's cost" if self.capped else ""
        return (f"find_heads on {self.metric}: the top {len(found)} of the {int(self.ablated.all(0).sum())} heads "
                f"ablated exactly on every prompt: {heads}; "
                f"{len(self.table)} of {len(self.attribution.units)} heads ablated exactly "
                f"({why.get('flagged', 0)} flagged, {why.get('verified', 0)} verified in {self.steps} steps, "
                f"{why.get('sampled', 0)} sampled, {why.get('per prompt', 0)} more on single prompts); "
                f"{c['total']:.1f} forward-equivalents per prompt, "
                f"{c['total'] / c['sweep']:.2f} of the sweep's {c['sweep']:.1f}{cap}; {self.recall_text()}{nan_text}")


def stated_recall(recall: tuple) -> tuple[float, float, float, str]:
    """``recall_bound``'s answer, with a sampled bound whose interval is :data:`RECALL_WIDTH` or wider made
    "unknown" (its recall NaN, its interval kept)."""
    value, low, high, kind = recall
    if kind == "sampled" and not high - low < RECALL_WIDTH:
        return math.nan, low, high, "unknown"
    return value, low, high, kind
