"""Replay lp.find_heads on saved exact sweeps: how its settings trade top-20 recall against cost.

find_heads' decisions depend only on AtP's scores, each head's write ratio (its flag signal) and
the exact values of the heads it ablates. Given the full exact sweep of a set of prompts, its
pipeline (lensprobe's own ``_pipeline``, unchanged) runs again for any setting without a forward
pass: each exact ablation is read from the sweep and costed as the batched sweep costs it. This is
how find_heads' defaults were chosen, on MATH-500 problems drawn with seeds 0 and 1 (8 each, zero
ablation, entropy and the answer's log-probability); ``benchmarks/find_heads.py`` measures them on
other problems.

    python benchmarks/find_heads_replay.py collect --seed 0 --prompts 8 --out build/replay  # slow: the sweeps
    python benchmarks/find_heads_replay.py replay build/replay/*.pt                         # seconds
    python benchmarks/find_heads_replay.py replay build/replay/*.pt --flag 0.07 --step 5 --refine 3 \
        --sample 10 --each 0 1 --recheck 0 1                # the two next steps, on and off

``--each 1`` flags a head on each prompt alone (``flag_each_prompt=True``), ``--recheck 1`` sends the
search on when the random check finds a head that beats the weakest found (``recheck=True``).
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import itertools  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import torch  # noqa: E402
from attribution import ablation_settings, exact_sweep, metric_settings  # noqa: E402

import lensprobe as lp  # noqa: E402
from lensprobe.core.hooks.forward import as_prompts  # noqa: E402
from lensprobe.core.measures.forced import resolve_measures  # noqa: E402
from lensprobe.experiments.findheads import _pipeline, _prompt_write_ratios, _Search  # noqa: E402
from lensprobe.experiments.findheads_cost import ATP_COST, FLAG_COST, sweep_cost  # noqa: E402
from lensprobe.experiments.sweep import chunk_cost, layer_chunks  # noqa: E402

TOP = 20
GRID = {"flag": (0.07, 0.08, 0.09, 0.10), "step": (5, 10, 20), "refine": (0, 3, 5), "sample": (10, 20), "each": (0,),
        "recheck": (0,)}


def collect(args) -> None:
    torch.set_num_threads(args.threads)
    model = lp.load_model()
    problems = lp.load_math500(limit=args.prompts, seed=args.seed)
    prompts = [lp.build_prompt(model, p.problem, system=lp.MATH_SYSTEM_PROMPT) for p in problems]
    args.out.mkdir(parents=True, exist_ok=True)
    for ablation in args.ablation or ["zero"]:
        for metric in args.metric or ["entropy", "logprob"]:
            met = metric_settings(metric, problems)
            abl = ablation_settings(ablation, model, prompts, met)
            changes, heads = exact_sweep(model, prompts, dict(met), abl, 32)
            name = met.pop("metric")
            att = lp.attribute_heads(model, prompts, name, method="atp", **abl, **met)
            items = as_prompts(model, prompts, build_strings=True)
            measures = resolve_measures(model, name, len(items), answers=met.get("answers"))
            per_prompt = _prompt_write_ratios(model, items, measures, att.settings, int(model.cfg.n_layers))
            path = args.out / f"seed{args.seed}_{ablation}_{metric}.pt"
            torch.save({"changes": changes, "heads": heads, "estimates": att.estimates, "scores": att.scores,
                        "ratios": per_prompt.amax(0), "prompt_ratios": per_prompt, "metric": name, "lengths": [len(p) for p in prompts]}, path)
            print(f"saved {path}", flush=True)


def replay(saved: dict, *, flag: float, step: int, refine: int, sample: int, each: int = 0, recheck: int = 0,
           n_layers: int = 30, batch_size: int = 32) -> dict:
    """find_heads' pipeline on ``saved`` (a ``collect`` file): recall against the sweep, and cost."""
    changes = saved["changes"]
    pairs = [(int(layer), int(head)) for layer, head in saved["heads"]]
    att = SimpleNamespace(units=[(layer, (head,)) for layer, head in pairs], scores=saved["scores"],
                          estimates=saved["estimates"], metric=saved["metric"],
                          labels=[f"L{layer}H{head}" for layer, head in pairs])

    def ablate(chosen, batch, which, clean):
        cost = sum(chunk_cost(c, n_layers) for c in layer_chunks(([None] if clean else []) + chosen, n_layers, batch))
        index = [pairs.index(pair) for pair in chosen]
        return changes[which][:, index], torch.zeros(len(which)) if clean else None, cost

    ratios = saved.get("prompt_ratios", saved["ratios"][None])  # [prompt, layer, head]
    write = ratios[:, [p[0] for p in pairs], [p[1] for p in pairs]].expand(changes.shape[0], -1)
    limit = sweep_cost(pairs, n_layers, batch_size) - ATP_COST - FLAG_COST  # as find_heads caps the search
    search = _Search(att, pairs, changes.shape[0], TOP, batch_size, ablate, limit=limit, n_layers=n_layers)
    found = _pipeline(search, write, flag, step, refine, None, sample, 0, n_layers, flag_each_prompt=bool(each),
                      recheck=bool(recheck))

    def truth(values):
        return {att.labels[i] for i in torch.argsort(values.abs(), descending=True, stable=True)[:TOP].tolist()}

    per = [len(set(found.per_prompt[p]) & truth(changes[p])) / TOP for p in range(changes.shape[0])]
    return {"over": len(set(found.found["head_label"]) & truth(changes.mean(0))) / TOP,
            "per": sum(per) / len(per), "min": min(per), "share": found.cost["total"] / found.cost["sweep"],
            "capped": found.capped}


def grid(paths: list[Path], settings: dict) -> None:
    data = {p.stem: torch.load(p) for p in paths}
    print(f"replayed on {', '.join(data)}; recall is top-{TOP}, worst over the files; cost in the sweep's "
          "forward-equivalents")
    print("| flag | step | refine | sample | flag each prompt | recheck | over prompts | per prompt, mean (min) | "
          "cost, mean (max) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for flag, step, refine, sample, each, recheck in itertools.product(*settings.values()):
        runs = [replay(d, flag=flag, step=step, refine=refine, sample=sample, each=each, recheck=recheck)
                for d in data.values()]
        shares = [r["share"] for r in runs]
        capped = " (capped)" if any(r["capped"] for r in runs) else ""
        print(f"| {flag} | {step} | {refine} | {sample} | {'yes' if each else 'no'} | {'yes' if recheck else 'no'} | "
              f"{min(r['over'] for r in runs):.2f} | "
              f"{min(r['per'] for r in runs):.3f} ({min(r['min'] for r in runs):.2f}) | "
              f"{sum(shares) / len(shares):.3f} ({max(shares):.3f}){capped} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="exact sweeps, AtP and write ratios of MATH-500 problems")
    c.add_argument("--seed", type=int, required=True)
    c.add_argument("--prompts", type=int, default=8)
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--ablation", choices=("zero", "mean", "resample"), action="append")
    c.add_argument("--metric", choices=("entropy", "logprob"), action="append")
    c.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("replay", help="the grid of settings over collected files")
    r.add_argument("paths", type=Path, nargs="+")
    for name, values in GRID.items():
        r.add_argument(f"--{name}", type=float if name == "flag" else int, nargs="+", default=list(values))
    args = ap.parse_args()
    collect(args) if args.command == "collect" else grid(args.paths, {name: getattr(args, name) for name in GRID})


if __name__ == "__main__":
    main()
