"""Generated tokens per second of the evaluation harness vs plain ``transformers`` ``generate``.

On the embedded SmolLM2-135M-Instruct, the first ``--problems`` level-1 MATH-500 problems
under the "w/o" condition (the paper's system prompt), greedy, ``--max-new-tokens`` new
tokens, batches of ``--batch-size`` left-padded prompts, stopping rows at end-of-sequence:

- ``harness``: ``lp.evaluate(...)`` end to end (prompt building, the KV-cached generation
  loop on the TransformerBridge, answer extraction and both graders), rows kept in memory;
- ``hf sdpa``: plain ``transformers`` ``generate()`` of the same weights loaded afresh with
  ``AutoModelForCausalLM`` (default sdpa attention: what a plain transformers user gets),
  on the same token ids, same batches: the reference of the target;
- ``hf eager``: the same with eager attention (the implementation the TransformerBridge uses).

Each method runs ``--repeats`` rounds, interleaved; the medians and the best runs of
generated tokens per second (tokens up to and including each row's end-of-sequence token)
are compared (on a busy machine the best run is the least disturbed). Target:
harness / hf sdpa >= 0.9. The harness's rows must hold the same text as both.

Usage:
    python benchmarks/eval_throughput.py --problems 8 --batch-size 8 --max-new-tokens 64 --repeats 3 [--threads 1]
"""

import argparse
import statistics
import time

import torch

import lensprobe as lp
from lensprobe.core.models import model_label
from lensprobe.evals import builtin_condition
from lensprobe.evals.data import math500_path


def hf_generate(hf, tokenizer, prompts, batch_size: int, max_new_tokens: int) -> tuple[int, list[list[int]]]:
    """Plain transformers generate over left-padded batches; returns (tokens, per-row ids)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    pad = pad if pad is not None else eos
    rows: list[list[int]] = []
    for i in range(0, len(prompts), batch_size):
        batch = [p.tokens[0].tolist() for p in prompts[i:i + batch_size]]
        width = max(len(b) for b in batch)
        ids = torch.tensor([[pad] * (width - len(b)) + b for b in batch])
        mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch])
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                              eos_token_id=eos, pad_token_id=pad)
        for row in out[:, width:].tolist():
            kept = []
            for t in row:
                kept.append(t)
                if t == eos:
                    break
            rows.append(kept)
    return sum(len(r) for r in rows), rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data", default=None, help="MATH-500 JSONL (default: the local copy)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    path = args.data or math500_path()
    if path is None:
        raise SystemExit("MATH-500 not found: pass --data PATH.jsonl or set LENSPROBE_MATH500")
    model = lp.load_model()
    problems = lp.load_math500(path, levels=1, limit=args.problems)
    build = builtin_condition("w/o").prompt_builder(model)
    prompts = [build(p.problem) for p in problems]
    from transformers import AutoModelForCausalLM

    from lensprobe.core.models import quiet

    folder = model.original_model.name_or_path  # the converted folder the bridge was loaded from
    with quiet():
        hf_sdpa = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa",
                                                       dtype=torch.float32).eval()
        hf_eager = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                        dtype=torch.float32).eval()
    tok = model.tokenizer
    print(f"model {model_label(model)}, {len(problems)} problems, batch "
          f"{args.batch_size}, max_new_tokens {args.max_new_tokens}, greedy, torch threads "
          f"{torch.get_num_threads()}")

    def run_harness():
        rows = lp.evaluate(model, problems, "w/o", max_new_tokens=args.max_new_tokens,
                           batch_size=args.batch_size, progress=False)
        return int(rows["generated_tokens"].sum()), rows

    methods = {
        "harness": run_harness,
        "hf sdpa": lambda: hf_generate(hf_sdpa, tok, prompts, args.batch_size, args.max_new_tokens),
        "hf eager": lambda: hf_generate(hf_eager, tok, prompts, args.batch_size, args.max_new_tokens),
    }
    rates: dict[str, list[float]] = {name: [] for name in methods}
    outputs = {}
    run_harness()  # warm-up (first forward allocations, math-verify import)
    for _ in range(args.repeats):
        for name, fn in methods.items():
            t0 = time.perf_counter()
            n, out = fn()
            rates[name].append(n / (time.perf_counter() - t0))
            outputs[name] = out
            print(f"  {name}: {n} tokens, {rates[name][-1]:.1f} tokens/s", flush=True)
    harness_rows = outputs["harness"]

    def texts(rows):
        return [tok.decode(ids[:-1] if ids and ids[-1] == tok.eos_token_id else ids) for ids in rows]

    same = {ref: texts(outputs[ref]) == list(harness_rows["generation"]) for ref in ("hf sdpa", "hf eager")}
    med = {name: statistics.median(v) for name, v in rates.items()}
    best = {name: max(v) for name, v in rates.items()}
    for name, v in med.items():
        print(f"{name:>9}: {v:8.1f} generated tokens/s median, {best[name]:.1f} best (runs "
              f"{', '.join(f'{x:.1f}' for x in rates[name])})")
    # Best-of is the least disturbed by other processes on a shared machine; both are printed.
    for ref in ("hf sdpa", "hf eager"):
        target = " (target >= 0.9)" if ref == "hf sdpa" else ""
        print(f"ratio harness / {ref} generate: {med['harness'] / med[ref]:.3f}x median, "
              f"{best['harness'] / best[ref]:.3f}x best{target}")
    print("same generated text: " + ", ".join(f"{ref}: {ok}" for ref, ok in same.items()))


if __name__ == "__main__":
    main()
