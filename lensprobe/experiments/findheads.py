"""Finding the heads that matter, exactly, at a fraction of the sweep's cost: :func:`find_heads`.

An exact ablation sweep measures every head (one forward row per head); attribution patching
estimates every head from a forward and a backward but misses heads whose ablation lies far
outside its linear regime. :func:`find_heads` combines them:

1. **Estimate** every head with AtP (:func:`~lensprobe.experiments.attribution.attribute_heads`).
2. **Flag** the heads outside the linear regime and ablate them exactly whatever their estimate:
   a head whose ablation moves the residual stream by more than ``flag`` of its norm
   (``||dz_h W_O^h|| / ||resid_pre||`` over the ablated positions, the largest over prompts).
   On SmolLM2-135M the heads of layers 0 and 1 write 0.14-0.21 of the residual stream, the
   others at most 0.08, and AtP's slope underestimates exactly those (e.g. L1H5: slope +0.04,
   exact +1.51).
3. **Verify in estimate order**: the other heads are ablated exactly in AtP's order (its score,
   mean over prompts), ``step`` at a time. **Stopping rule**: the search stops after the first
   step that adds no head to the exact top ``top`` (ranked by ``|exact|``, mean over prompts),
   or when ``budget`` single-head ablations are spent.
4. **Check the rest**: ``sample`` heads drawn at random from those not ablated are ablated too;
   how many of them beat the weakest head of the exact top gives an estimated lower bound of
   the recall with its 95% interval, as :class:`~lensprobe.experiments.verify.Verification`
   states it (exact when every head was ablated).

Every exact ablation runs through the batched sweep (:func:`~lensprobe.experiments.sweep.sweep_prompt`):
rows are sorted by layer and cut into batches where it costs least
(:func:`~lensprobe.experiments.sweep.layer_chunks`), so heads of nearby layers share a batch and
a batch runs the layers below its lowest ablated head once. The cost is counted in forward-equivalents per prompt: AtP 3 (a forward and a backward), the flag
pass 1, a batch of ``r`` rows whose lowest ablated layer is ``s`` of ``L`` layers
``s / L + r (L - s) / L``. The thresholds (``flag=0.10``) were set on one set of prompts; the
benchmark ``benchmarks/find_heads.py`` measures the pipeline against the full sweep.

Example:
    >>> found = lp.find_heads(model, prompts, "entropy", top=20)
    >>> found.found[["head_label", "exact", "why"]]
    >>> print(found.summary())
"""

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import intervene, recording_hook
from lensprobe.core.hooks.forward import as_prompts
from lensprobe.core.hooks.heads import head_label, hook_z_name
from lensprobe.core.lazy import pandas
from lensprobe.core.measures.forced import resolve_measures
from lensprobe.experiments.atp import _delta_z
from lensprobe.experiments.attribution import Attribution, attribute_heads, prompt_positions
from lensprobe.experiments.sweep import _PREFIX_SAFE, chunk_cost, layer_chunks, sweep_prompt
from lensprobe.experiments.verify import recall_bound

__all__ = ["HeadSearch", "find_heads"]

ATP_COST = 3.0
"""Forward-equivalents of one AtP pass on one prompt (a forward, and a backward at about two)."""


@dataclass
class HeadSearch:
    """What :func:`find_heads` found and what it cost.

    Attributes:
        table: one row per head ablated exactly: ``layer``, ``head``, ``head_label``, ``estimate``
            and ``score`` (AtP, mean over prompts), ``write`` (the flag signal), ``exact`` (mean over
            prompts of the exact change), ``why`` (``"flagged"``, ``"verified"`` or ``"sampled"``),
            ``atp_rank`` (1 = AtP's first), ``exact_rank`` (1 = largest ``|exact|``).
        exact: ``[prompt, head]`` exact changes of the heads of ``table``, in its order.
        top: how many heads were asked for.
        per_prompt: per prompt, the labels of the ``top`` heads with the largest ``|exact|`` there
            (among the heads ablated exactly).
        recall, recall_kind, recall_low, recall_high, outside, sampled, beat: what is known of the
            over-prompts top's recall, as :class:`~lensprobe.experiments.verify.Verification` says it
            (``outside``: heads not ablated before the random check).
        cost: forward-equivalents per prompt: ``"attribution"``, ``"flag"``, ``"exact"``, ``"total"``,
            and for comparison ``"sweep"`` (every head, batched like the sweep) and
            ``"one_at_a_time"`` (the same exact heads, one forward each, plus the clean run).
        steps: verification steps run (after the flagged heads).
        attribution: the AtP estimates.
        metric: the metric's name.
    """

    table: Any
    exact: Tensor
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

    @property
    def found(self):
        """The ``top`` heads with the largest ``|exact|`` (mean over prompts), largest first."""
        return self.table.sort_values("exact_rank", kind="stable").head(self.top).reset_index(drop=True)

    def recall_text(self) -> str:
        """What is known of the top-k recall (see :meth:`Verification.recall_text
        <lensprobe.experiments.verify.Verification.recall_text>`)."""
        k = self.top
        if self.recall_kind == "exact":
            return f"top-{k} exact (every head ablated)"
        if self.recall_kind == "unknown":
            return f"top-{k} recall not measured (sample=0: none of the {self.outside} heads left was checked)"
        return (f"top-{k} recall >= {self.recall:.2f} estimated (95% interval {self.recall_low:.2f}-"
                f"{self.recall_high:.2f}) from {self.sampled} random heads of the {self.outside} not ablated, "
                f"{self.beat} of which beat the weakest found")

    def summary(self) -> str:
        """One line: what was ablated exactly, what it cost against the sweep, what is known of recall."""
        why = self.table["why"].value_counts()
        c = self.cost
        return (f"find_heads on {self.metric}: {len(self.table)} of {len(self.attribution.units)} heads ablated exactly "
                f"({why.get('flagged', 0)} flagged, {why.get('verified', 0)} verified in {self.steps} steps, "
                f"{why.get('sampled', 0)} sampled); {c['total']:.1f} forward-equivalents per prompt, "
                f"{c['total'] / c['sweep']:.2f} of the sweep's {c['sweep']:.1f}; {self.recall_text()}")


def _write_ratios(model, items, measures, settings: dict, n_layers: int) -> Tensor:
    """``[layer, head]``: the largest over prompts of ``||dz_h W_O^h|| / ||resid_pre||`` at the ablated positions."""
    n_heads = int(model.cfg.n_heads)
    out = torch.zeros(n_layers, n_heads, device="cpu")
    w_o = [model.blocks[layer].attn.W_O.detach().float() for layer in range(n_layers)]
    for p, (prompt, measure, source) in enumerate(zip(items, measures, settings["sources"], strict=True)):
        store: dict = {}
        hooks = [(hook_z_name(layer), recording_hook(store, ("z", layer))) for layer in range(n_layers)]
        hooks += [(f"blocks.{layer}.hook_resid_pre", recording_hook(store, ("resid", layer))) for layer in range(n_layers)]
        tokens = measure.inputs(model, prompt)
        with torch.no_grad(), intervene(model, *hooks):
            model(tokens)
        pos = prompt_positions(settings, p, prompt)
        n = int(tokens.shape[-1])
        index = torch.arange(n)[None]
        selected = (torch.ones_like(index, dtype=torch.bool) if pos is None else pos.select(index))[0]
        for layer in range(n_layers):
            z = store[("z", layer)][0]
            dz = _delta_z(z, layer, pos, source)  # [pos, head, d_head]
            write = torch.einsum("pnd,ndm->pnm", dz.to(w_o[layer].device), w_o[layer])
            resid = store[("resid", layer)][0].float()[selected.to(z.device)]
            denom = float(resid.norm()) or 1.0
            out[layer] = torch.maximum(out[layer], write.norm(dim=(0, 2)).cpu() / denom)
    return out


def _ablate(model, items, measures, att: Attribution, pairs: list[tuple[int, int]], batch_size: int, share: bool,
            clean: bool) -> tuple[Tensor, Tensor | None, float]:
    """``([prompt, pair] exact values, [prompt] clean values or None, forward-equivalents per prompt)``."""
    s = att.settings
    n_layers = int(model.cfg.n_layers)
    chunks = layer_chunks(([None] if clean else []) + list(pairs), n_layers, batch_size)
    order = [pairs.index(row) for chunk in chunks for row in chunk if row is not None]
    values = torch.empty(len(items), len(pairs), device="cpu")
    base = torch.empty(len(items), device="cpu") if clean else None
    share = share and type(measures[0]) in _PREFIX_SAFE
    for p, (prompt, measure, source) in enumerate(zip(items, measures, s["sources"], strict=True)):
        pos = prompt_positions(s, p, prompt)
        flat, share = sweep_prompt(model, prompt, measure, chunks, s["method"], pos, source, share)
        if clean:
            base[p] = flat[0]  # type: ignore[index]
            flat = flat[1:]
        values[p, order] = flat
    cost = sum(chunk_cost(c, n_layers, share) for c in chunks)
    return values, base, cost


def _check_settings(top: Any, sample: Any, batch_size: Any, step: Any, budget: Any, flag: Any) -> None:
    for name, value, low in (("top", top, 1), ("sample", sample, 0), ("batch_size", batch_size, 1),
                             ("step", 1 if step is None else step, 1), ("budget", 0 if budget is None else budget, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise LensprobeError(f"{name} must be a whole number >= {low}, got {value!r}.")
    if not isinstance(flag, (int, float)) or isinstance(flag, bool) or flag < 0:
        raise LensprobeError(f"flag must be a share >= 0 of the residual stream's norm, got {flag!r}.")


def find_heads(model, prompts, metric: Any = "entropy", *, top: int = 20, ablation: Any = "zero",
               reference: Any = None, positions: Any = None, answers: Any = None, tokens: Any = None,
               continuation: Any = None, align: Any = None, flag: float = 0.10, step: int | None = None, budget: int | None = None,
               sample: int = 20, seed: int = 0, batch_size: int = 32) -> HeadSearch:
    """The exact top-``top`` heads by the effect of ablating each, at a fraction of the sweep's cost.

    See the module documentation for the pipeline: AtP estimates, exact ablation of the heads
    ``flag`` marks as outside the linear regime, exact verification in AtP order ``step`` heads
    at a time until a step adds nothing to the exact top (or ``budget`` is spent), and a random
    sample of the rest to estimate what was missed.

    Args:
        model: a TransformerLens model.
        prompts: prompts as :func:`~lensprobe.experiments.attribution.attribute_heads` takes them.
        metric, ablation, reference, positions, answers, tokens, continuation, align: as in
            :func:`~lensprobe.experiments.attribution.attribute_heads` (the exact ablations use
            the same settings, so estimates and exact values measure the same thing).
        top: how many heads to find.
        flag: ablate exactly every head whose ablation moves the residual stream by more than this
            share of its norm (``0`` ablates every head: the sweep; ``float("inf")`` none).
        step: heads verified per step (default: ``top``).
        budget: at most this many single-head ablations in steps 2-3 (``None``: until the stopping rule).
        sample: heads drawn at random from the rest and ablated exactly (the recall check).
        seed: the random draw's seed.
        batch_size: single-head ablations per forward.

    Returns:
        A :class:`HeadSearch`: ``.found`` (the exact top), ``.table`` (every head ablated, and why),
        ``.per_prompt``, ``.cost``, ``.summary()``.

    Raises:
        LensprobeError: bad settings, or what :func:`attribute_heads` refuses.

    Example:
        >>> found = lp.find_heads(model, prompts, "entropy", top=20)
        >>> print(found.summary())
    """
    _check_settings(top, sample, batch_size, step, budget, flag)
    att = attribute_heads(model, prompts, metric, method="atp", ablation=ablation, reference=reference,
                          positions=positions, answers=answers, tokens=tokens, continuation=continuation, align=align)
    if att.unit != "head":
        raise LensprobeError("find_heads works on single heads.")  # pragma: no cover - attribute_heads default
    items = as_prompts(model, prompts, build_strings=True)
    measures = resolve_measures(model, metric, len(items), answers=answers, tokens=tokens, continuation=continuation)
    n_layers, n_units = int(model.cfg.n_layers), len(att.units)
    top = min(top, n_units)
    step = top if step is None else step
    pairs = [(layer, heads[0]) for layer, heads in att.units]
    score = att.scores.mean(0)
    atp_order = torch.argsort(score, descending=True, stable=True).tolist()
    ratios = _write_ratios(model, items, measures, att.settings, n_layers)
    write = torch.tensor([float(ratios[layer, head]) for layer, head in pairs])
    why: dict[int, str] = {i: "flagged" for i in range(n_units) if float(write[i]) > flag}
    exact: dict[int, Tensor] = {}
    cost = {"attribution": ATP_COST, "flag": 1.0, "exact": 0.0}

    clean: list[Tensor] = []  # the unablated values, computed once (with the first exact batch)

    def run(units: list[int], reason: str) -> None:
        values, base, spent = _ablate(model, items, measures, att, [pairs[i] for i in units], batch_size, True,
                                      not clean)
        if base is not None:
            clean.append(base)
        for j, i in enumerate(units):
            exact[i] = values[:, j] - clean[0]
            why.setdefault(i, reason)
        cost["exact"] += spent

    def exact_top() -> set[int]:
        ranked = sorted(exact, key=lambda i: -float(exact[i].mean().abs()))
        return set(ranked[:top])

    run(sorted(why), "flagged")  # with the clean row, also when nothing is flagged
    steps, spent = 0, 0
    queue = [i for i in atp_order if i not in exact]
    while queue and (budget is None or spent < budget):
        take = queue[: step if budget is None else min(step, budget - spent)]
        queue = queue[len(take):]
        before = exact_top()
        run(take, "verified")
        steps, spent = steps + 1, spent + len(take)
        if len(before) >= top and exact_top() == before:
            break
    rest = [i for i in range(n_units) if i not in exact]
    outside = len(rest)
    pick = sorted(rest[k] for k in torch.randperm(len(rest), generator=torch.Generator().manual_seed(seed))[:sample].tolist())
    if pick:
        run(pick, "sampled")
    found = exact_top()
    weakest = min(float(exact[i].mean().abs()) for i in found)
    beat = sum(float(exact[i].mean().abs()) > weakest for i in pick)
    # every head ablated: the found top is the true top (recall 1, exact)
    known = recall_bound(1.0, top, outside, len(pick), beat)
    return _search(att, pairs, exact, why, write, score, atp_order, top, known, outside, len(pick), beat, cost, steps,
                   n_layers, batch_size)


def _search(att: Attribution, pairs, exact: dict[int, Tensor], why: dict[int, str], write: Tensor, score: Tensor,
            atp_order: list[int], top: int, recall: tuple, outside: int, sampled: int, beat: int, cost: dict,
            steps: int, n_layers: int, batch_size: int) -> HeadSearch:
    units = sorted(exact, key=lambda i: -float(exact[i].mean().abs()))
    atp_rank = {i: r + 1 for r, i in enumerate(atp_order)}
    est = att.estimates.mean(0)
    table = pandas().DataFrame([
        {"layer": pairs[i][0], "head": pairs[i][1], "head_label": head_label(*pairs[i]), "estimate": float(est[i]),
         "score": float(score[i]), "write": float(write[i]), "exact": float(exact[i].mean()), "why": why[i],
         "atp_rank": atp_rank[i], "exact_rank": r + 1} for r, i in enumerate(units)])
    values = torch.stack([exact[i] for i in units], dim=1)
    per_prompt = [[head_label(*pairs[units[j]]) for j in torch.argsort(values[p].abs(), descending=True,
                                                                         stable=True)[:top].tolist()]
                  for p in range(values.shape[0])]
    rows = [None, *pairs]
    sweep = sum(chunk_cost(rows[i: i + batch_size], n_layers) for i in range(0, len(rows), batch_size))
    cost = {**cost, "total": cost["attribution"] + cost["flag"] + cost["exact"], "sweep": sweep,
            "one_at_a_time": float(len(units) + 1)}
    value, low, high, kind = recall
    return HeadSearch(table, values, top, per_prompt, value, kind, low, high, outside, sampled, beat, cost, steps, att,
                      att.metric)
