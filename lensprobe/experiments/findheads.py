"""Finding the heads that matter, exactly, at a fraction of the sweep's cost: :func:`find_heads`.

An exact ablation sweep measures every head (one forward row per head); attribution patching
estimates every head from a forward and a backward but misses heads whose ablation lies far
outside its linear regime. :func:`find_heads` combines them:

1. **Estimate** every head with AtP (:func:`~lensprobe.experiments.attribution.attribute_heads`).
2. **Flag** the heads outside the linear regime and ablate them exactly whatever their estimate:
   a head whose ablation moves the residual stream by more than ``flag`` of its norm
   (``||dz_h W_O^h|| / ||resid_pre||`` over the ablated positions, the largest over prompts).
   On SmolLM2-135M (zero ablation, 16 MATH-500 prompts) the heads of layers 0 and 1 write up to
   0.37 of the residual stream, about 20 heads of layers 2-11 0.07-0.12, the median head of
   layers 2-29 0.01; AtP's slope underestimates the large writers (L1H5: slope +0.04, exact
   +1.51; L11H1, writing 0.08: +0.06 against +0.23).
3. **Verify in estimate order**: the other heads are ablated exactly on every prompt in AtP's
   order (its score, mean over prompts), ``step`` at a time. **Stopping rule**: the search stops
   after the first step that adds no head to the exact top ``top`` (ranked by ``|exact|``, mean
   over prompts), or when ``budget`` single-head ablations are spent.
4. **Check the rest**: ``sample`` heads drawn at random from those not ablated are ablated too;
   how many of them beat the weakest head of the exact top gives an estimated lower bound of
   the over-prompts recall with its 95% interval, as :class:`~lensprobe.experiments.verify.Verification`
   states it (exact when every head was ablated).
5. **Per prompt**: a head can matter on one prompt and not on average, so each prompt then goes on
   alone, in its own AtP order, ``refine`` heads at a time, with the same stopping rule on its own
   exact top (``refine=0`` skips this). Those heads are ablated on that prompt only.

Every exact ablation runs through the batched sweep (:func:`~lensprobe.experiments.sweep.sweep_prompt`):
rows are sorted by layer and cut into batches where it costs least
(:func:`~lensprobe.experiments.sweep.layer_chunks`), so heads of nearby layers share a batch and
a batch runs the layers below its lowest ablated head once. The cost is counted in forward-equivalents per prompt: AtP 3 (a forward and a backward), the flag
pass 1, a batch of ``r`` rows whose lowest ablated layer is ``s`` of ``L`` layers
``s / L + r (L - s) / L``. The defaults (``flag=0.07``, ``step=5``, ``refine=3``, ``sample=10``)
were chosen by replaying the pipeline on the exact sweeps of 16 MATH-500 problems (zero ablation,
entropy and the answer's log-probability) as the setting with the least cost whose top-20 recall
was at least 0.95 over prompts and per prompt there; the benchmark ``benchmarks/find_heads.py``
measures it against the full sweep on other problems.

Example:
    >>> found = lp.find_heads(model, prompts, "entropy", top=20)
    >>> found.found[["head_label", "exact", "why"]]
    >>> print(found.summary())
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor

from lensprobe.core.checks import count, finite_number
from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import intervene, recording_hook
from lensprobe.core.hooks.forward import as_prompts
from lensprobe.core.hooks.heads import head_label, hook_z_name
from lensprobe.core.lazy import pandas
from lensprobe.core.measures.forced import resolve_measures
from lensprobe.experiments.atp_gradients import delta_z
from lensprobe.experiments.attribution import Attribution, attribute_heads, prompt_positions
from lensprobe.experiments.sweep import PREFIX_SAFE, chunk_cost, layer_chunks, sweep_prompt
from lensprobe.experiments.verify import recall_bound

__all__ = ["HeadSearch", "find_heads"]

ATP_COST = 3.0
"""Forward-equivalents of one AtP pass on one prompt (a forward, and a backward at about two)."""


@dataclass
class HeadSearch:
    """What :func:`find_heads` found and what it cost.

    Attributes:
        table: one row per head ablated exactly: ``layer``, ``head``, ``head_label``, ``estimate``
            (AtP, mean over the prompts it was ablated on) and ``score`` (AtP's, mean over prompts),
            ``write`` (the flag signal), ``exact`` (mean of the exact change over the ``prompts`` it was
            ablated on), ``prompts``, ``why`` (``"flagged"``, ``"verified"``, ``"sampled"``, or
            ``"per prompt"``: ablated on some prompts only, in step 5), ``atp_rank`` (1 = AtP's first),
            ``exact_rank`` (1 = largest ``|exact|`` among the heads ablated on every prompt; empty for
            the others and for a head whose ablation made the metric NaN), ``nan_prompts`` (the prompts on
            which its ablation made the metric NaN: such a head is reported, never ranked). Heads ablated
            on every prompt come first.
        exact: ``[prompt, head]`` exact changes of the heads of ``table``, in its order (meaningful where
            ``ablated`` is true; NaN there only when the ablation made the metric NaN).
        ablated: ``[prompt, head]`` bool, whether the head of ``table`` was ablated on the prompt.
        top: how many heads were asked for.
        per_prompt: per prompt, the labels of the ``top`` heads with the largest ``|exact|`` there
            (among the heads ablated exactly on it), largest first.
        recall, recall_kind, recall_low, recall_high, outside, sampled, beat: what is known of the
            over-prompts top's recall, as :class:`~lensprobe.experiments.verify.Verification` says it
            (``outside``: heads not ablated before the random check).
        cost: forward-equivalents per prompt (mean over prompts): ``"attribution"``, ``"flag"``,
            ``"exact"`` (of which ``"per_prompt"`` in step 5), ``"total"``, and for comparison
            ``"sweep"`` (every head, batched like the sweep) and ``"one_at_a_time"`` (the same exact
            heads, one forward each, plus the clean run).
        steps: verification steps run on every prompt (step 3).
        attribution: the AtP estimates.
        metric: the metric's name.
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
        nan = list(self.table.loc[self.table["nan_prompts"] > 0, "head_label"])
        nan_text = f"; metric NaN when ablating {', '.join(nan)} (not ranked)" if nan else ""
        return (f"find_heads on {self.metric}: {len(self.table)} of {len(self.attribution.units)} heads ablated exactly "
                f"({why.get('flagged', 0)} flagged, {why.get('verified', 0)} verified in {self.steps} steps, "
                f"{why.get('sampled', 0)} sampled, {why.get('per prompt', 0)} more on single prompts); "
                f"{c['total']:.1f} forward-equivalents per prompt, "
                f"{c['total'] / c['sweep']:.2f} of the sweep's {c['sweep']:.1f}; {self.recall_text()}{nan_text}")


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
            dz = delta_z(z, layer, pos, source)  # [pos, head, d_head]
            write = torch.einsum("pnd,ndm->pnm", dz.to(w_o[layer].device), w_o[layer])
            resid = store[("resid", layer)][0].float()[selected.to(z.device)]
            denom = float(resid.norm()) or 1.0
            out[layer] = torch.maximum(out[layer], write.norm(dim=(0, 2)).cpu() / denom)
    return out


def _ablate(model, items, measures, att: Attribution, pairs: list[tuple[int, int]], batch_size: int, which: list[int],
            clean: bool) -> tuple[Tensor, Tensor | None, float]:
    """``([prompt of which, pair] exact values, [prompt of which] clean values or None, forward-equivalents per
    prompt)``."""
    s = att.settings
    n_layers = int(model.cfg.n_layers)
    chunks = layer_chunks(([None] if clean else []) + list(pairs), n_layers, batch_size)
    order = [pairs.index(row) for chunk in chunks for row in chunk if row is not None]
    values = torch.empty(len(which), len(pairs), device="cpu")
    base = torch.empty(len(which), device="cpu") if clean else None
    share = type(measures[0]) in PREFIX_SAFE
    for k, p in enumerate(which):
        pos = prompt_positions(s, p, items[p])
        flat, share = sweep_prompt(model, items[p], measures[p], chunks, s["method"], pos, s["sources"][p], share)
        if clean:
            base[k] = flat[0]  # type: ignore[index]
            flat = flat[1:]
        values[k, order] = flat
    cost = sum(chunk_cost(c, n_layers, share) for c in chunks)
    return values, base, cost


class _Search:
    """The exact values found so far: ``values[prompt, unit]``, meaningful where ``ablated[prompt, unit]`` (a
    NaN there is the metric's own), the clean values, why each unit was first ablated, and the
    forward-equivalents spent per prompt.
    ``ablate(pairs, which, clean)`` runs the exact ablations, as :func:`_ablate` after its first four
    arguments."""

    def __init__(self, att: Attribution, pairs: list, n_prompts: int, top: int, batch_size: int,
                 ablate: Callable[..., tuple[Tensor, Tensor | None, float]]):
        self.att, self.pairs, self.top, self.batch_size, self.ablate = att, pairs, top, batch_size, ablate
        self.values = torch.zeros((n_prompts, len(pairs)), device="cpu")
        self.ablated = torch.zeros((n_prompts, len(pairs)), dtype=torch.bool)
        self.clean: Tensor | None = None
        self.why: dict[int, str] = {}
        self.spent = torch.zeros(n_prompts, dtype=torch.float64)

    def run(self, units: list[int], reason: str, prompt: int | None = None) -> None:
        """Ablate ``units`` exactly on every prompt (or on ``prompt`` alone); the clean row goes with the first run."""
        which = list(range(self.values.shape[0])) if prompt is None else [prompt]
        values, base, cost = self.ablate([self.pairs[i] for i in units], self.batch_size, which, self.clean is None)
        if base is not None:
            self.clean = base
        for j, i in enumerate(units):
            self.values[which, i] = values[:, j] - self.clean[which]  # type: ignore[index]
            self.ablated[which, i] = True
            self.why.setdefault(i, reason)
        self.spent[which] += cost

    def everywhere(self) -> list[int]:
        """Units ablated on every prompt."""
        return self.ablated.all(0).nonzero().flatten().tolist()

    def ranked(self, prompt: int | None = None) -> list[int]:
        """The ``top`` units with the largest ``|exact|``, largest first: mean over prompts (among units ablated on
        every prompt), or on ``prompt``; a unit whose value is NaN (the metric's) is not ranked."""
        if prompt is None:
            units, value = self.everywhere(), self.values.mean(0)
        else:
            units, value = self.ablated[prompt].nonzero().flatten().tolist(), self.values[prompt]
        return sorted((i for i in units if not value[i].isnan()), key=lambda i: -abs(float(value[i])))[: self.top]

    def top_units(self, prompt: int | None = None) -> set[int]:
        return set(self.ranked(prompt))


def _check_settings(top: Any, sample: Any, batch_size: Any, step: Any, budget: Any, flag: Any, refine: Any) -> None:
    for name, value, low in (("top", top, 1), ("sample", sample, 0), ("batch_size", batch_size, 1),
                             ("step", 1 if step is None else step, 1), ("budget", 0 if budget is None else budget, 0),
                             ("refine", refine, 0)):
        count(name, value, low)
    finite_number("flag", flag, 0, allow_inf=True)  # a share of the residual stream's norm; inf flags none


def find_heads(model, prompts, metric: Any = "entropy", *, top: int = 20, ablation: Any = "zero",
               reference: Any = None, positions: Any = None, answers: Any = None, tokens: Any = None,
               continuation: Any = None, align: Any = None, flag: float = 0.07, step: int = 5,
               refine: int = 3, budget: int | None = None, sample: int = 10, seed: int = 0,
               batch_size: int = 32) -> HeadSearch:
    """The exact top-``top`` heads by the effect of ablating each, over prompts and per prompt, at a
    fraction of the sweep's cost.

    See the module documentation for the pipeline: AtP estimates, exact ablation of the heads
    ``flag`` marks as outside the linear regime, exact verification in AtP order ``step`` heads
    at a time until a step adds nothing to the exact top, a random sample of the rest to
    estimate what was missed, and per prompt the same verification in that prompt's AtP order,
    ``refine`` heads at a time.

    Args:
        model: a TransformerLens model.
        prompts: prompts as :func:`~lensprobe.experiments.attribution.attribute_heads` takes them.
        metric, ablation, reference, positions, answers, tokens, continuation, align: as in
            :func:`~lensprobe.experiments.attribution.attribute_heads` (the exact ablations use
            the same settings, so estimates and exact values measure the same thing).
        top: how many heads to find.
        flag: ablate exactly every head whose ablation moves the residual stream by more than this
            share of its norm (``0`` ablates every head: the sweep; ``float("inf")`` none).
        step: heads verified per step on every prompt.
        refine: heads verified per step on one prompt in the per-prompt phase (``0``: no such phase).
        budget: at most this many single-head ablations per prompt in the verification and per-prompt
            phases together (``None``: until the stopping rules).
        sample: heads drawn at random from the rest and ablated exactly on every prompt (the recall check).
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
    _check_settings(top, sample, batch_size, step, budget, flag, refine)
    att = attribute_heads(model, prompts, metric, method="atp", ablation=ablation, reference=reference,
                          positions=positions, answers=answers, tokens=tokens, continuation=continuation, align=align)
    if att.unit != "head":
        raise LensprobeError("find_heads works on single heads.")  # pragma: no cover - attribute_heads default
    items = as_prompts(model, prompts, build_strings=True)
    measures = resolve_measures(model, metric, len(items), answers=answers, tokens=tokens, continuation=continuation)
    n_layers, n_units = int(model.cfg.n_layers), len(att.units)
    top = min(top, n_units)
    pairs = [(layer, heads[0]) for layer, heads in att.units]
    ratios = _write_ratios(model, items, measures, att.settings, n_layers)
    write = torch.tensor([float(ratios[layer, head]) for layer, head in pairs])
    search = _Search(att, pairs, len(items), top, batch_size, partial(_ablate, model, items, measures, att))
    return _pipeline(search, write, flag, step, refine, budget, sample, seed, n_layers)


def _pipeline(search: _Search, write: Tensor, flag: float, step: int, refine: int, budget: int | None, sample: int,
              seed: int, n_layers: int) -> HeadSearch:
    """Steps 2-5 of the module documentation, on AtP's estimates and the flag signal ``write`` per unit."""
    att, top, n_units = search.att, search.top, len(search.pairs)
    search.run([i for i in range(n_units) if float(write[i]) > flag], "flagged")  # with the clean row
    order = torch.argsort(att.scores.mean(0), descending=True, stable=True).tolist()
    steps, spent = _verify(search, order, step, budget, None)
    rest = [i for i in range(n_units) if i not in search.why]
    pick = sorted(rest[k] for k in torch.randperm(len(rest), generator=torch.Generator().manual_seed(seed))[:sample].tolist())
    if pick:
        search.run(pick, "sampled")
    mean = search.values.mean(0)
    weakest = min((abs(float(mean[i])) for i in search.top_units()), default=0.0)
    beat = sum(abs(float(mean[i])) > weakest for i in pick)
    known = recall_bound(1.0, top, len(rest), len(pick), beat)  # every head ablated: exact
    shared = float(search.spent[0])
    if refine:
        for p in range(search.values.shape[0]):
            left = None if budget is None else budget - spent
            own = torch.argsort(att.scores[p], descending=True, stable=True).tolist()
            _verify(search, own, refine, left, p)
    cost = {"attribution": ATP_COST, "flag": 1.0, "exact": float(search.spent.mean()),
            "per_prompt": float(search.spent.mean()) - shared}
    return _result(search, write, order, known, len(rest), len(pick), beat, cost, steps, n_layers)


def _verify(search: _Search, order: list[int], step: int, budget: int | None, prompt: int | None) -> tuple[int, int]:
    """Ablate the units in ``order`` not yet ablated (on ``prompt``, or on every prompt), ``step`` at a time,
    until a step leaves the exact top as it was or ``budget`` units are spent; the steps run and units spent."""
    done = search.ablated.all(0) if prompt is None else search.ablated[prompt]
    queue = [i for i in order if not bool(done[i])]
    steps, spent = 0, 0
    while queue and (budget is None or spent < budget):
        take = queue[: step if budget is None else min(step, budget - spent)]
        queue = queue[len(take):]
        before = search.top_units(prompt)
        search.run(take, "verified" if prompt is None else "per prompt", prompt)
        steps, spent = steps + 1, spent + len(take)
        if len(before) >= search.top and search.top_units(prompt) == before:
            break
    return steps, spent


def _result(search: _Search, write: Tensor, order: list[int], recall: tuple, outside: int, sampled: int, beat: int,
            cost: dict, steps: int, n_layers: int) -> HeadSearch:
    att, pairs, values, top = search.att, search.pairs, search.values, search.top
    seen = search.ablated
    exact = {i: float(values[seen[:, i], i].mean()) for i in search.why}  # NaN only when the metric was
    ranked = sorted((i for i in search.everywhere() if not math.isnan(exact[i])), key=lambda i: -abs(exact[i]))
    partial = sorted((i for i in search.why if i not in set(ranked)),
                     key=lambda i: (math.isnan(exact[i]), 0.0 if math.isnan(exact[i]) else -abs(exact[i])))
    units = ranked + partial
    atp_rank = {i: r + 1 for r, i in enumerate(order)}
    est = att.estimates
    table = pandas().DataFrame([
        {"layer": pairs[i][0], "head": pairs[i][1], "head_label": head_label(*pairs[i]),
         "estimate": float(est[seen[:, i], i].mean()), "score": float(att.scores[:, i].mean()), "write": float(write[i]),
         "exact": exact[i], "prompts": int(seen[:, i].sum()), "why": search.why[i],
         "atp_rank": atp_rank[i], "nan_prompts": int((seen[:, i] & values[:, i].isnan()).sum())} for i in units])
    table["exact_rank"] = pandas().array([r + 1 for r in range(len(ranked))] + [None] * len(partial), dtype="Int64")
    per_prompt = [[head_label(*pairs[i]) for i in search.ranked(p)] for p in range(values.shape[0])]
    rows = [None, *pairs]
    batch = search.batch_size
    sweep = sum(chunk_cost(rows[i: i + batch], n_layers) for i in range(0, len(rows), batch))
    cost = {**cost, "total": cost["attribution"] + cost["flag"] + cost["exact"], "sweep": sweep,
            "one_at_a_time": float(seen.sum(1).double().mean()) + 1.0}
    value, low, high, kind = recall
    return HeadSearch(table, values[:, units], seen[:, units], top, per_prompt, value, kind, low, high, outside, sampled, beat, cost,
                      steps, att, att.metric)
