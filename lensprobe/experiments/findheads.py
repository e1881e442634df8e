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

**Never more than the sweep.** Before any forward it estimates both costs in forward-equivalents per
prompt: its plan (AtP, the flag pass, and the fewest exact ablations the stopping rule allows:
``top + step + sample`` heads and the clean row, at the sweep's mean cost per row) against the batched
sweep of every head. When the sweep costs no more, it runs the sweep instead (``method="sweep"``, said in
the summary). While searching, an exact ablation that would take the total past the sweep's cost is not
run: the search stops there and says so (``capped``).

**Never more than it showed.** The summary names the heads found with their exact effects (each ablated
exactly on every prompt) and states the recall only when it is known: exact when every head was ablated,
a lower bound when the random check bounds it within an interval narrower than :data:`RECALL_WIDTH`,
otherwise "recall not known".

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
from functools import partial
from typing import Any

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import intervene, recording_hook
from lensprobe.core.hooks.forward import as_prompts
from lensprobe.core.hooks.heads import head_label, hook_z_name
from lensprobe.core.lazy import pandas
from lensprobe.core.measures.forced import resolve_measures
from lensprobe.experiments import findheads_cost as costs
from lensprobe.experiments.atp_gradients import delta_z
from lensprobe.experiments.attribution import (
    Attribution,
    aligned_sources,
    attribute_heads,
    attribution_sources,
    head_units,
    prompt_positions,
)
from lensprobe.experiments.findheads_result import RECALL_WIDTH, HeadSearch, stated_recall
from lensprobe.experiments.sweep import PREFIX_SAFE, chunk_cost, layer_chunks, sweep_prompt
from lensprobe.experiments.verify import recall_bound
from lensprobe.interventions.ablation import check_ablation_positions

__all__ = ["RECALL_WIDTH", "HeadSearch", "find_heads"]

def _write_ratios(model, items, measures, settings: dict, n_layers: int) -> Tensor:
    """``[layer, head]``: the largest over prompts of ``||dz_h W_O^h|| / ||resid_pre||`` at the ablated positions."""
    return _prompt_write_ratios(model, items, measures, settings, n_layers).amax(0)


def _prompt_write_ratios(model, items, measures, settings: dict, n_layers: int) -> Tensor:
    """``[prompt, layer, head]``: ``||dz_h W_O^h|| / ||resid_pre||`` at the ablated positions of each prompt."""
    n_heads = int(model.cfg.n_heads)
    out = torch.zeros(len(items), n_layers, n_heads, device="cpu")
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
            out[p, layer] = write.norm(dim=(0, 2)).cpu() / denom
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
    ``ablate(pairs, batch_size, which, clean)`` runs the exact ablations, as :func:`_ablate` after its first four
    arguments. ``limit``: the forward-equivalents per prompt the exact ablations may spend (a run that would
    pass it is not run, and ``capped`` says so); ``n_layers`` costs a run before it runs."""

    def __init__(self, att: Attribution, pairs: list, n_prompts: int, top: int, batch_size: int,
                 ablate: Callable[..., tuple[Tensor, Tensor | None, float]], limit: float = math.inf,
                 n_layers: int = 1):
        self.att, self.pairs, self.top, self.batch_size, self.ablate = att, pairs, top, batch_size, ablate
        self.values = torch.zeros((n_prompts, len(pairs)), device="cpu")
        self.ablated = torch.zeros((n_prompts, len(pairs)), dtype=torch.bool)
        self.clean = torch.full((n_prompts,), math.nan)
        self.has_clean = torch.zeros(n_prompts, dtype=torch.bool)
        self.why: dict[int, str] = {}
        self.spent = torch.zeros(n_prompts, dtype=torch.float64)
        self.limit, self.n_layers, self.capped = limit, n_layers, False

    def run(self, units: list[int], reason: str, prompt: int | None = None) -> bool:
        """Ablate ``units`` exactly on every prompt (or on ``prompt`` alone), each only where it was not ablated
        yet; the clean row goes with a prompt's first run. False when a run was refused for passing ``limit``."""
        which = list(range(self.values.shape[0])) if prompt is None else [prompt]
        mask = torch.zeros_like(self.ablated)
        for p in which:
            mask[p, units] = True
        return self.run_mask(mask, reason, which)

    def run_mask(self, mask: Tensor, reason: str, which: list[int] | None = None) -> bool:
        """Ablate unit ``u`` on prompt ``p`` where ``mask[p, u]`` and it was not ablated yet, on the prompts
        ``which`` (default: every prompt); a prompt's first run takes its clean row (alone if it ablates nothing).
        Prompts with the same units share a run."""
        groups: dict[tuple, list[int]] = {}
        for p in range(mask.shape[0]) if which is None else which:
            units = tuple((mask[p] & ~self.ablated[p]).nonzero().flatten().tolist())
            if units or not bool(self.has_clean[p]):
                groups.setdefault((units, bool(self.has_clean[p])), []).append(p)
        ok = True
        for (units, has_clean), which in groups.items():
            rows = [self.pairs[i] for i in units]
            if math.isfinite(self.limit):
                need = costs.rows_cost(([] if has_clean else [None]) + rows, self.n_layers, self.batch_size)
                if float(self.spent[which].max()) + need > self.limit + 1e-9:
                    self.capped, ok = True, False
                    continue
            values, base, cost = self.ablate(rows, self.batch_size, which, not has_clean)
            if base is not None:
                self.clean[which] = base
                self.has_clean[which] = True
            for j, i in enumerate(units):
                self.values[which, i] = values[:, j] - self.clean[which]
                self.ablated[which, i] = True
                self.why.setdefault(i, reason)
            self.spent[which] += cost
        return ok

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


def _exact_settings(model, items, measures, ablation: Any, reference: Any, positions: Any, align: Any,
                    layers: list[int]) -> dict:
    """The ablation settings :func:`attribute_heads` would hand on, checked the same way, without its passes."""
    kind, sources = attribution_sources(model, len(items), ablation, reference, False, layers)
    aligned = None
    if align is not None and align is not False:
        sources, aligned = aligned_sources(model, items, ablation, align, positions, "head", layers)
    settings = {"method": kind, "sources": sources, "aligned": aligned, "positions": positions}
    for p, (prompt, measure) in enumerate(zip(items, measures, strict=True)):
        check_ablation_positions(prompt_positions(settings, p, prompt), int(measure.inputs(model, prompt).shape[-1]))
    return settings


def find_heads(model, prompts, metric: Any = "entropy", *, top: int = 20, ablation: Any = "zero",
               reference: Any = None, positions: Any = None, answers: Any = None, tokens: Any = None,
               continuation: Any = None, align: Any = None, flag: float = 0.07, step: int = 5,
               refine: int = 3, budget: int | None = None, sample: int = 10, seed: int = 0,
               batch_size: int = 32, flag_each_prompt: bool = False, recheck: bool = False) -> HeadSearch:
    """The exact top-``top`` heads by the effect of ablating each, over prompts and per prompt, at a
    fraction of the sweep's cost, and never more than it.

    See the module documentation for the pipeline: AtP estimates, exact ablation of the heads
    ``flag`` marks as outside the linear regime, exact verification in AtP order ``step`` heads
    at a time until a step adds nothing to the exact top, a random sample of the rest to
    check what was missed, and per prompt the same verification in that prompt's AtP order,
    ``refine`` heads at a time. Before any forward it compares the least the search can cost
    with the sweep's cost, and runs the exact sweep instead when that is no dearer
    (``method="sweep"``); while searching it never spends more than the sweep.

    Args:
        model: a TransformerLens model.
        prompts: prompts as :func:`~lensprobe.experiments.attribution.attribute_heads` takes them.
        metric, ablation, reference, positions, answers, tokens, continuation, align: as in
            :func:`~lensprobe.experiments.attribution.attribute_heads` (the exact ablations use
            the same settings, so estimates and exact values measure the same thing).
        top: how many heads to find.
        flag: ablate exactly every head whose ablation moves the residual stream by more than this
            share of its norm (``0`` ablates every head: the sweep runs instead; ``float("inf")`` none).
        step: heads verified per step on every prompt.
        refine: heads verified per step on one prompt in the per-prompt phase (``0``: no such phase).
        budget: at most this many single-head ablations per prompt in the verification and per-prompt
            phases together (``None``: until the stopping rules).
        sample: heads drawn at random from the rest and ablated exactly on every prompt (the recall check).
        seed: the random draw's seed.
        batch_size: single-head ablations per forward.
        flag_each_prompt: ablate a flagged head only on the prompts where it writes more than ``flag``
            (``False``: on every prompt when it does on one); the verification then orders a head flagged
            on some prompts by its exact values there and AtP's estimates elsewhere.
        recheck: when a head of the random check beats the weakest head found, go on verifying in AtP
            order and check again with a new draw, until a draw finds nothing better.

    Returns:
        A :class:`HeadSearch`: ``.found`` (the exact top), ``.table`` (every head ablated, and why),
        ``.per_prompt``, ``.cost``, ``.method``, ``.summary()``.

    Raises:
        LensprobeError: bad settings, or what :func:`attribute_heads` refuses.

    Example:
        >>> found = lp.find_heads(model, prompts, "entropy", top=20)
        >>> print(found.summary())
    """
    costs.check_search_settings(top, sample, batch_size, step, budget, flag, refine)
    if not isinstance(flag_each_prompt, bool) or not isinstance(recheck, bool):
        raise LensprobeError(f"flag_each_prompt and recheck are True or False, got {flag_each_prompt!r} and "
                             f"{recheck!r}.")
    items = as_prompts(model, prompts, build_strings=True)
    n_layers = int(model.cfg.n_layers)
    pairs = [(layer, heads[0]) for layer, heads in head_units(model, "all", "head")]
    top = min(top, len(pairs))
    planned = costs.search_plan(pairs, n_layers, top, step, sample, flag, batch_size)
    if planned["search"] >= planned["sweep"]:
        return _sweep(model, items, metric, pairs, top, planned, batch_size, ablation=ablation, reference=reference,
                      positions=positions, answers=answers, tokens=tokens, continuation=continuation, align=align)
    att = attribute_heads(model, prompts, metric, method="atp", ablation=ablation, reference=reference,
                          positions=positions, answers=answers, tokens=tokens, continuation=continuation, align=align)
    measures = resolve_measures(model, metric, len(items), answers=answers, tokens=tokens, continuation=continuation)
    ratios = _prompt_write_ratios(model, items, measures, att.settings, n_layers)
    write = ratios[:, [p[0] for p in pairs], [p[1] for p in pairs]]  # [prompt, unit]
    search = _Search(att, pairs, len(items), top, batch_size, partial(_ablate, model, items, measures, att),
                     limit=planned["sweep"] - costs.ATP_COST - costs.FLAG_COST, n_layers=n_layers)
    found = _pipeline(search, write, flag, step, refine, budget, sample, seed, n_layers,
                      flag_each_prompt=flag_each_prompt, recheck=recheck)
    found.planned = planned
    return found


def _sweep(model, items, metric: Any, pairs: list, top: int, planned: dict, batch_size: int, *, ablation: Any,
           reference: Any, positions: Any, answers: Any, tokens: Any, continuation: Any, align: Any) -> HeadSearch:
    """Every head ablated exactly, batched as the sweep, with no AtP pass: when the search costs no less."""
    measures = resolve_measures(model, metric, len(items), answers=answers, tokens=tokens, continuation=continuation,
                                gradient=True)  # the metrics the search takes
    n_layers, n = int(model.cfg.n_layers), len(pairs)
    settings = _exact_settings(model, items, measures, ablation, reference, positions, align,
                               sorted({p[0] for p in pairs}))
    none = torch.full((len(items), n), math.nan)
    n_heads = int(model.cfg.n_heads)
    att = Attribution([(layer, (head,)) for layer, head in pairs], none, none.clone(), torch.full((len(items),), math.nan),
                      "none", getattr(measures[0], "name", str(metric)), "head", n_layers, n_heads,
                      n_heads // int(getattr(model.cfg, "n_key_value_heads", None) or n_heads), settings)
    search = _Search(att, pairs, len(items), top, batch_size, partial(_ablate, model, items, measures, att),
                     n_layers=n_layers)
    search.run(list(range(n)), "swept")
    att.values = search.clean.clone()
    cost = {"attribution": 0.0, "flag": 0.0, "exact": float(search.spent.mean()), "per_prompt": 0.0}
    recall = recall_bound(1.0, top, 0, 0, 0)
    found = _result(search, torch.full((len(items), n), math.nan), [], recall, 0, 0, 0, cost, 0, n_layers)
    found.method, found.planned = "sweep", planned
    return found


def _pipeline(search: _Search, write: Tensor, flag: float, step: int, refine: int, budget: int | None, sample: int,
              seed: int, n_layers: int, *, flag_each_prompt: bool = False, recheck: bool = False) -> HeadSearch:
    """Steps 2-5 of the module documentation, on AtP's estimates and the flag signal ``write`` (``[prompt, unit]``,
    or ``[unit]``: the largest over prompts)."""
    att, top, n_units = search.att, search.top, len(search.pairs)
    n_prompts = search.values.shape[0]
    write = write if write.dim() == 2 else write[None].expand(n_prompts, -1)
    flagged = write > flag if flag_each_prompt else (write.amax(0) > flag)[None].expand(n_prompts, -1)
    search.run_mask(flagged, "flagged")  # with the clean rows (alone when nothing is flagged)
    magnitude = torch.where(search.ablated, search.values.abs().nan_to_num(0.0), att.scores)
    order = torch.argsort(magnitude.mean(0), descending=True, stable=True).tolist()
    steps, spent = _verify(search, order, step, budget, None)
    generator = torch.Generator().manual_seed(seed)
    checks = 0
    while True:
        rest = [i for i in range(n_units) if not bool(search.ablated[:, i].all())]
        pick = sorted(rest[k] for k in torch.randperm(len(rest), generator=generator)[:sample].tolist())
        if pick and not search.run(pick, "sampled"):
            pick = [i for i in pick if bool(search.ablated[:, i].all())]
        checks += 1
        mean = search.values.mean(0)
        weakest = min((abs(float(mean[i])) for i in search.top_units()), default=0.0)
        beat = sum(abs(float(mean[i])) > weakest for i in pick)
        left = None if budget is None else budget - spent
        if not (recheck and beat and (left is None or left > 0)) or search.capped:
            break
        more, used = _verify(search, order, step, left, None)
        if not used:
            break
        steps, spent = steps + more, spent + used
    known = recall_bound(1.0, top, len(rest), len(pick), beat)  # every head ablated: exact
    shared = float(search.spent.mean())
    if refine:
        for p in range(n_prompts):
            left = None if budget is None else budget - spent
            own = torch.argsort(att.scores[p], descending=True, stable=True).tolist()
            _verify(search, own, refine, left, p)
    cost = {"attribution": costs.ATP_COST, "flag": costs.FLAG_COST, "exact": float(search.spent.mean()),
            "per_prompt": float(search.spent.mean()) - shared}
    found = _result(search, write, order, known, len(rest), len(pick), beat, cost, steps, n_layers)
    found.capped, found.checks = search.capped, checks
    return found


def _verify(search: _Search, order: list[int], step: int, budget: int | None, prompt: int | None) -> tuple[int, int]:
    """Ablate the units in ``order`` not yet ablated (on ``prompt``, or on every prompt), ``step`` at a time,
    until a step leaves the exact top as it was, ``budget`` units are spent, or the next step would pass the
    sweep's cost; the steps run and units spent."""
    done = search.ablated.all(0) if prompt is None else search.ablated[prompt]
    queue = [i for i in order if not bool(done[i])]
    steps, spent = 0, 0
    while queue and (budget is None or spent < budget):
        take = queue[: step if budget is None else min(step, budget - spent)]
        queue = queue[len(take):]
        before = search.top_units(prompt)
        if not search.run(take, "verified" if prompt is None else "per prompt", prompt):
            break
        steps, spent = steps + 1, spent + len(take)
        if len(before) >= search.top and search.top_units(prompt) == before:
            break
    return steps, spent


def _result(search: _Search, write: Tensor, order: list[int], recall: tuple, outside: int, sampled: int, beat: int,
            cost: dict, steps: int, n_layers: int) -> HeadSearch:
    att, pairs, values, top = search.att, search.pairs, search.values, search.top
    seen = search.ablated
    written = write.amax(0) if write.dim() == 2 else write
    exact = {i: float(values[seen[:, i], i].mean()) for i in search.why}  # NaN only when the metric was
    ranked = sorted((i for i in search.everywhere() if not math.isnan(exact[i])), key=lambda i: -abs(exact[i]))
    partial = sorted((i for i in search.why if i not in set(ranked)),
                     key=lambda i: (math.isnan(exact[i]), 0.0 if math.isnan(exact[i]) else -abs(exact[i])))
    units = ranked + partial
    atp_rank = {i: r + 1 for r, i in enumerate(order)}
    est = att.estimates
    table = pandas().DataFrame([
        {"layer": pairs[i][0], "head": pairs[i][1], "head_label": head_label(*pairs[i]),
         "estimate": float(est[seen[:, i], i].mean()), "score": float(att.scores[:, i].mean()),
         "write": float(written[i]), "exact": exact[i], "prompts": int(seen[:, i].sum()), "why": search.why[i],
         "atp_rank": atp_rank.get(i), "nan_prompts": int((seen[:, i] & values[:, i].isnan()).sum())} for i in units],
        columns=["layer", "head", "head_label", "estimate", "score", "write", "exact", "prompts", "why", "atp_rank",
                 "nan_prompts"])
    table["exact_rank"] = pandas().array([r + 1 for r in range(len(ranked))] + [None] * len(partial), dtype="Int64")
    per_prompt = [[head_label(*pairs[i]) for i in search.ranked(p)] for p in range(values.shape[0])]
    sweep = costs.sweep_cost(pairs, n_layers, search.batch_size)
    cost = {**cost, "total": cost["attribution"] + cost["flag"] + cost["exact"], "sweep": sweep,
            "one_at_a_time": float(seen.sum(1).double().mean()) + 1.0}
    value, low, high, kind = stated_recall(recall)
    return HeadSearch(table, values[:, units], seen[:, units], top, per_prompt, value, kind, low, high, outside, sampled,
                      beat, cost, steps, att, att.metric)
