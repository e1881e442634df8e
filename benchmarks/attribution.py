"""Attribution patching (AtP, AtP*) vs the exact batched ablation sweep, on the embedded model.

On SmolLM2-135M-Instruct (30 layers x 9 query heads = 270 heads) and ``--prompts`` MATH-500
problems (chat template, lensprobe's MATH system prompt), metric: next-token entropy at the
last prompt position, zero ablation of every head at ``hook_z``. In one run this times

- ``exact``: ``lp.ablation_sweep(model, prompts, "entropy", batch_size=32)`` (every head, exactly);
- ``atp``: ``lp.attribute_heads(model, prompts, "entropy", method="atp")``;
- ``atp*``: the same with ``method="atp*"`` (QK fix and GradDrop);

and prints the speed ratios, the agreement of each estimate with the exact effects (Spearman
of the signed estimate vs the exact change, Spearman of the ranking score vs |exact|,
top-20 recall), the heads each method misses from the exact top 20, how many of its top heads
an exact check must ablate to recover 0.85, 0.95 and all of the exact top 20, and the peak memory of
each method above the loaded model (process RSS, Linux). It ends with a cost model in
forward-pass equivalents and what it predicts for a 28 x 28-head model (Qwen2.5-Math-7B).

Then, as the paper recommends (and not part of AtP or AtP*): each method's top ``--verify-top``
heads ablated exactly with ``lp.verify_attribution`` and ranked by their exact effects; its
time (the attribution's plus the verification's) and top-20 recall.

``--ablation mean`` replaces every head's output by its mean over the same prompts' positions
(in the sweep, the attribution and the verification) instead of zero. ``--ablation resample``
gives each head, at every position, its output on another MATH-500 problem's prompt (drawn
from problems outside the benchmark's set: the shortest unused one at least as long as the inputs the
metric runs, the answer's tokens included, so the shared template positions hold the same tokens): the counterfactual patching the AtP* paper
evaluates, a smaller step from the clean run than zeroing.

``--metric logprob`` measures the log-probability of each problem's reference answer (its
MATH-500 answer text, teacher-forced after the prompt) instead of next-token entropy: a target
metric of the kind the AtP* paper evaluates. Entropy rises under almost any disruption of the
model, an effect of second order that first-order estimates cannot see.

Targets (not asserted): AtP >= 15x faster than the exact sweep; AtP* faster than it; AtP*
top-20 recall >= 0.85.

``OMP_WAIT_POLICY=PASSIVE`` is set (unless already set) before torch is imported: on a
shared machine, OpenMP's spinning threads otherwise make the many small operations of AtP*'s
local passes many times slower.

Usage:
    python benchmarks/attribution.py --prompts 16 --threads 2
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from procmem import reset_peak, rss_kib  # noqa: E402

import lensprobe as lp  # noqa: E402
from lensprobe.core.measures.forced import resolve_measures  # noqa: E402
from lensprobe.experiments.verify import agreement  # noqa: E402


def timed(fn):
    reset_peak()
    base = rss_kib()[0]
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t, (rss_kib()[1] - base) / 1024


def exact_top(exact, k: int = 20) -> list[int]:
    """The ``k`` heads with the largest exact effect (by magnitude), largest first."""
    return torch.argsort(exact.abs(), descending=True)[:k].tolist()


def misses(att, exact, labels, k=20):
    truth = exact_top(exact, k)
    picked = set(torch.argsort(att.scores.mean(0), descending=True)[:k].tolist())
    return [f"{labels[i]} (exact {float(exact[i]):+.4f}, est {float(att.estimates.mean(0)[i]):+.4f})"
            for i in truth if i not in picked]


def cost_model(n_layers: int, n_heads: int, qkv_share: float, batch: int = 32) -> dict[str, float]:
    """Forward-pass equivalents per prompt (a backward counts 2, one layer 1/n_layers of a forward).

    exact: the sweep runs each head's layers from its own on (the prefix shared), in batches;
    atp: forward + backward; atp*: + GradDrop (for every layer, a backward through the layers
    below it) + the QK fix: a pass in which every later layer's attention pulls its gradients
    back (the full one and one per GradDrop layer above it: forward and backward of the
    norm + query/key/value projections, ``qkv_share`` of a layer's weights), one batch-1 pass
    per chunk of units, and every unit's norm + query/key/value projections at every later
    layer (the pos x pos attention scores are left out).
    """
    exact = n_heads * sum(n_layers - layer for layer in range(n_layers)) / n_layers
    graddrop = 2 * sum(range(n_layers)) / n_layers
    chunks = -(-n_heads * (n_layers - 1) // batch)
    pullback = 1 + 3 * qkv_share * sum(n_layers - layer for layer in range(1, n_layers)) / n_layers
    qk = pullback + chunks + qkv_share * n_heads * sum(range(n_layers)) / n_layers
    return {"exact": exact, "atp": 3.0, "atp*": 3.0 + graddrop + qk}


def qkv_share(d_model: int, d_mlp: int, n_heads: int, n_kv: int, d_head: int) -> float:
    """Share of a layer's weights in the query, key and value projections (gated MLP, bias-free)."""
    qkv = d_model * d_head * (n_heads + 2 * n_kv)
    return qkv / (qkv + d_model * n_heads * d_head + 3 * d_model * d_mlp)


def print_cost_model(t_exact: float | None = None, t_star: float | None = None) -> None:
    smol = cost_model(30, 9, qkv_share(576, 1536, 9, 3, 64))
    qwen = cost_model(28, 28, qkv_share(3584, 18944, 28, 4, 128))
    measured = f" (measured {t_exact / t_star:.2f}x)" if t_exact and t_star else ""
    print("\ncost model, forward-pass equivalents per prompt (exact / AtP / AtP*):")
    print(f"  SmolLM2-135M (30 x 9 heads): {smol['exact']:.0f} / {smol['atp']:.0f} / {smol['atp*']:.0f} "
          f"-> AtP {smol['exact'] / smol['atp']:.0f}x, AtP* {smol['exact'] / smol['atp*']:.1f}x faster than exact{measured}")
    print(f"  Qwen2.5-Math-7B (28 x 28 heads): {qwen['exact']:.0f} / {qwen['atp']:.0f} / {qwen['atp*']:.0f} "
          f"-> AtP {qwen['exact'] / qwen['atp']:.0f}x, AtP* {qwen['exact'] / qwen['atp*']:.1f}x")


def report(name: str, att, exact, labels) -> None:
    a = agreement(att.estimates.mean(0), att.scores.mean(0), exact, 20)
    print(f"\n{name}: Spearman(estimate, exact) {a['spearman']:.3f}, Spearman(score, |exact|) "
          f"{a['spearman_abs']:.3f}, top-20 recall {a['recall']:.2f}")
    if name == "AtP*":
        plain = agreement(att.estimates.mean(0), att.estimates.mean(0).abs(), exact, 20)
        print(f"  (AtP + QK fix alone, ranked by |estimate|: Spearman(|estimate|, |exact|) {plain['spearman_abs']:.3f}, "
              f"top-20 recall {plain['recall']:.2f})")
    print("  missed from the exact top 20: " + ("; ".join(misses(att, exact, labels)) or "none"), flush=True)
    print("  heads of its ranking to ablate exactly for top-20 recall 0.85 / 0.95 / 1.00: "
          + " / ".join(str(checks_needed(att.scores.mean(0), exact, r)) for r in (0.85, 0.95, 1.0)))


def checks_needed(score, exact, recall: float, k: int = 20) -> int:
    """Fewest of the ranking's top heads whose exact check holds ``recall`` of the exact top ``k``."""
    truth = set(exact_top(exact, k))
    need = math.ceil(recall * k - 1e-9)
    found = 0
    for i, unit in enumerate(torch.argsort(score, descending=True).tolist(), start=1):
        found += unit in truth
        if found >= need:
            return i
    return len(score)


def verified(model, prompts, name: str, att, seconds: float, exact, t_exact: float, top: int) -> None:
    """The attribution's ``top`` heads ablated exactly and ranked by their exact effects (not AtP*)."""
    ver, t_ver, _ = timed(lambda: lp.verify_attribution(model, prompts, att.settings["metric"], att, top=top))
    index = {label: i for i, label in enumerate(att.labels)}
    score = torch.full((len(att.labels),), -1.0)
    for label, value in zip(ver.table["head_label"], ver.table["exact"], strict=True):
        score[index[label]] = abs(float(value))
    recall = agreement(score, score, exact, 20)["recall"]
    total = seconds + t_ver
    print(f"{name} + exact ablation of its top {top}: {seconds:.1f} + {t_ver:.1f} = {total:.1f} s "
          f"({t_exact / total:.2f}x faster than the sweep), top-20 recall {recall:.2f}", flush=True)


def corrupted_prompts(model, prompts, needed: list[int] | None = None, seed: int = 1, pool: int = 200) -> list:
    """For each prompt, the shortest unused MATH-500 prompt outside ``prompts`` at least as long as it, or
    as ``needed`` tokens (the metric's inputs: the log-prob runs the prompt and the answer's tokens)."""
    taken = {p.text for p in prompts}
    others = [lp.build_prompt(model, q.problem, system=lp.MATH_SYSTEM_PROMPT)
              for q in lp.load_math500(limit=pool, seed=seed)]
    others = sorted((o for o in others if o.text not in taken), key=len)
    chosen = []
    for n in needed or [len(p) for p in prompts]:
        pick = next((i for i, o in enumerate(others) if len(o) >= n), None)
        if pick is None:
            raise SystemExit(f"no unused MATH-500 prompt of at least {n} tokens among {pool}")
        chosen.append(others.pop(pick))
    return chosen


def ablation_settings(kind: str, model, prompts, metric: dict) -> dict:
    """Zero, mean over ``prompts``, or resample from another problem's prompt as long as the inputs
    ``metric`` (``metric_settings``) runs."""
    if kind == "zero":
        return {"ablation": "zero"}
    if kind == "mean":
        return {"ablation": "mean", "reference": prompts}
    measures = resolve_measures(model, metric["metric"], len(prompts), answers=metric.get("answers"))
    needed = [int(m.inputs(model, p).shape[-1]) for m, p in zip(measures, prompts, strict=True)]
    return {"ablation": corrupted_prompts(model, prompts, needed)}


def metric_settings(kind: str, problems) -> dict:
    return {"metric": "entropy"} if kind == "entropy" else {"metric": "logprob", "answers": [p.answer for p in problems]}


def exact_sweep(model, prompts, metric: dict, abl: dict, batch_size: int):
    """Every head ablated exactly; resampling runs one sweep per prompt, from its own corrupted prompt."""
    common = {"batch_size": batch_size, "progress": False, "rank": 0, "world_size": 1}
    if isinstance(abl["ablation"], str):
        sweeps = [lp.ablation_sweep(model, prompts, method=abl["ablation"], reference=abl.get("reference"),
                                    **metric, **common)]
    else:
        answers = metric.get("answers") or [None] * len(prompts)
        sweeps = [lp.ablation_sweep(model, [p], metric["metric"], method="resample", reference=c, answers=a, **common)
                  for p, c, a in zip(prompts, abl["ablation"], answers, strict=True)]
    return torch.cat([s.changes for s in sweeps]), sweeps[0].heads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--ablation", choices=("zero", "mean", "resample"), default="zero")
    ap.add_argument("--metric", choices=("entropy", "logprob"), default="entropy")
    ap.add_argument("--verify-top", type=int, default=40, help="heads ablated exactly after each attribution")
    ap.add_argument("--cost-model-only", action="store_true", help="print the cost model and stop")
    args = ap.parse_args()
    if args.cost_model_only:
        print_cost_model()
        return
    torch.set_num_threads(args.threads)
    model = lp.load_model()
    problems = lp.load_math500(limit=args.prompts, seed=0)
    prompts = [lp.build_prompt(model, p.problem, system=lp.MATH_SYSTEM_PROMPT) for p in problems]
    lengths = [len(p) for p in prompts]
    print(f"{len(prompts)} MATH-500 prompts, {min(lengths)}-{max(lengths)} tokens; {args.threads} threads; "
          f"{args.ablation} ablation; metric {args.metric}")
    metric = metric_settings(args.metric, problems)
    abl = ablation_settings(args.ablation, model, prompts, metric)
    atp, t_atp, m_atp = timed(lambda: lp.attribute_heads(model, prompts, method="atp", **metric, **abl))
    print(f"AtP: {t_atp:.1f} s", flush=True)
    (changes, heads), t_exact, m_exact = timed(lambda: exact_sweep(model, prompts, metric, abl, args.batch_size))
    print(f"exact sweep: {t_exact:.1f} s", flush=True)
    exact = changes.mean(0)  # heads in the sweep's order: resolve_heads("all") = layer-major, as att.units
    assert [(lay, h[0]) for lay, h in atp.units] == heads
    report("AtP", atp, exact, atp.labels)
    star, t_star, m_star = timed(lambda: lp.attribute_heads(model, prompts, method="atp*", **metric,
                                                             batch_size=args.batch_size, **abl))
    print(f"AtP*: {t_star:.1f} s", flush=True)
    print(f"\nwall time: exact sweep {t_exact:.1f} s, AtP {t_atp:.1f} s, AtP* {t_star:.1f} s")
    print(f"speed-up over the exact sweep: AtP {t_exact / t_atp:.1f}x (target >= 15x), "
          f"AtP* {t_exact / t_star:.2f}x (target > 1x)")
    print(f"peak memory above the loaded model: exact {m_exact:.0f} MiB, AtP {m_atp:.0f} MiB, AtP* {m_star:.0f} MiB")
    report("AtP*", star, exact, atp.labels)
    by_layer = (atp.estimates.mean(0) - exact).abs().reshape(int(model.cfg.n_layers), -1).mean(1)
    worst = torch.argsort(by_layer, descending=True)[:3].tolist()
    print("\nlayers where AtP's error is largest (mean |estimate - exact|): "
          + ", ".join(f"L{lay} {float(by_layer[lay]):.4f}" for lay in worst))
    print_cost_model(t_exact, t_star)
    print("\nverification of the top candidates (the paper's recommendation; not AtP or AtP* alone):")
    verified(model, prompts, "AtP", atp, t_atp, exact, t_exact, args.verify_top)
    verified(model, prompts, "AtP*", star, t_star, exact, t_exact, args.verify_top)


if __name__ == "__main__":
    main()
