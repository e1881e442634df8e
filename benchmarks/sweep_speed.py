"""Speed of a batched head-ablation sweep vs one forward per ablated head.

On the embedded SmolLM2-135M-Instruct (30 layers x 9 query heads = 270 heads) and the
same prompts (a MATH question, and with ``--with-filler`` also the same question with the
paper's 55 "/" filler), this times:

- ``sweep``: ``lp.ablation_sweep(model, prompts, "entropy", heads="all")``: each forward
  runs ``--batch-size`` copies of a prompt, batch row ``b`` ablating its own head;
- ``lp loop``: one forward per (prompt, head) with ``lp.ablate_heads([(l, h)])`` attached
  (the same measure, so the same logits are computed per row);
- ``hf loop``: one plain ``transformers`` forward per (prompt, head), the head zeroed by a
  forward pre-hook on ``self_attn.o_proj`` (only the last position's logits, as the sweep).

Each method runs ``--repeats`` times, interleaved; the medians are compared and the ratios
printed (target: the sweep >= 3x faster than the lensprobe loop). The largest difference
between the sweep's numbers and the loops' is printed too.

Usage:
    python benchmarks/sweep_speed.py --batch-size 32 --repeats 1
"""

import argparse
import statistics
import time

import torch

import lensprobe as lp
from lensprobe.core.measures.measure import NextTokenEntropy, measure_once
from lensprobe.core.measures.metrics import entropy

QUESTION = "What is the value of $\\sqrt{36 \\times \\sqrt{16}}$?"


def lp_loop(model, prompts, heads):
    out = torch.empty(len(prompts), len(heads))
    for i, p in enumerate(prompts):
        for j, pair in enumerate(heads):
            out[i, j] = measure_once(model, NextTokenEntropy(), p, lp.ablate_heads([pair]))[0]
    return out


def hf_loop(model, prompts, heads):
    hf = model.original_model
    d = int(model.cfg.d_head)
    out = torch.empty(len(prompts), len(heads))
    for j, (layer, head) in enumerate(heads):
        def pre(mod, args, head=head):
            x = args[0].clone()
            x[..., head * d:(head + 1) * d] = 0
            return (x,)

        handle = hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(pre)
        try:
            with torch.inference_mode():
                for i, p in enumerate(prompts):
                    out[i, j] = entropy(hf(p.tokens, logits_to_keep=1).logits[0, -1])
        finally:
            handle.remove()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-size", type=int, default=32, help="heads per forward in the sweep")
    ap.add_argument("--repeats", type=int, default=1, help="timed rounds per method (median)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--with-filler", action="store_true", help="also sweep the question with the Mless filler")
    ap.add_argument("--no-hf", action="store_true", help="skip the plain transformers loop")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = lp.load_model()
    prompts = [lp.build_prompt(model, QUESTION, system=lp.MATH_SYSTEM_PROMPT)]
    if args.with_filler:
        prompts.append(lp.build_prompt(model, QUESTION, system=lp.MATH_SYSTEM_PROMPT,
                                       filler=lp.Filler.meaningless()))
    heads = [(layer, h) for layer in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    print(f"model: {model.cfg.n_layers} layers x {model.cfg.n_heads} heads = {len(heads)} heads; "
          f"prompts of {[len(p) for p in prompts]} tokens; batch size {args.batch_size}; "
          f"torch threads {torch.get_num_threads()}", flush=True)

    # warm-up (first calls allocate)
    lp.ablation_sweep(model, prompts[0], heads=heads[:4], batch_size=4, progress=False)
    measure_once(model, NextTokenEntropy(), prompts[0], lp.ablate_heads([heads[0]]))

    methods = {
        "sweep": lambda: lp.ablation_sweep(model, prompts, "entropy", heads="all", batch_size=args.batch_size,
                                           progress=False).ablated,
        "lp loop": lambda: lp_loop(model, prompts, heads),
    }
    if not args.no_hf:
        methods["hf loop"] = lambda: hf_loop(model, prompts, heads)
    times: dict[str, list[float]] = {k: [] for k in methods}
    results = {}
    for r in range(args.repeats):
        for name, run in methods.items():
            t = time.perf_counter()
            results[name] = run()
            times[name].append(time.perf_counter() - t)
            print(f"  round {r + 1}: {name} {times[name][-1]:.2f} s", flush=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    n_forward = len(prompts) * len(heads)
    for k, v in med.items():
        print(f"{k:>8}: {v:7.2f} s  ({n_forward / v:6.1f} ablated heads/s)")
    print(f"speed-up of the sweep over the lensprobe loop: {med['lp loop'] / med['sweep']:.2f}x (target >= 3x)")
    if "hf loop" in med:
        print(f"speed-up of the sweep over the transformers loop: {med['hf loop'] / med['sweep']:.2f}x")
    for k in [m for m in methods if m != "sweep"]:
        diff = (results["sweep"] - results[k]).abs().max().item()
        print(f"max |sweep - {k}| entropy difference: {diff:.2e} nats")


if __name__ == "__main__":
    main()
