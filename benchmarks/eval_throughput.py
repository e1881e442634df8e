"""Generated tokens per second of continuous batching vs static batches vs ``transformers.generate``.

On the embedded SmolLM2-135M-Instruct, the first ``--problems`` MATH-500 problems as the
"w/o" condition builds them (the paper's system prompt), greedy, two workloads:

- ``reference lengths``: each row stops after as many tokens as its reference solution has
  (the MATH-500 ``solution`` field in the model's tokens, at most ``--max-new-tokens``): a
  realistic spread of answer lengths (most answers short, a few long), the same for every
  method, whatever this small model writes;
- ``all to the cap``: every row runs ``--cap`` tokens (no finished rows to refill: the
  no-regression check).

End-of-sequence is ignored in both so every method generates the same tokens. Methods:

- ``lensprobe refill``: ``lp.generate(model, prompts, caps=..., batch_size=B)``, continuous
  batching: a finished row leaves the KV cache and the next prompt takes its slot;
- ``lensprobe static``: the same with ``refill=False`` (batches of B left-padded prompts,
  each stepped until its longest row ends: what lensprobe did before);
- ``hf generate bB``: plain ``transformers`` ``generate()`` on the same weights loaded afresh
  (default sdpa attention), the same token ids in batches of B in problem order, each batch
  generating its longest row's length (``generate`` has no per-row length; a row's tokens past
  its own length are thrown away and not counted);
- ``hf generate b1``: one prompt at a time, each its own length (the authors' scripts' setting).

A third workload, ``reference lengths + ARM``, runs the paper's method: ARM on layer 0 (``c=0.1``,
``percentile=95``, seeded; per-row statistics, the default) on the reference lengths:

- ``ARM refill``: continuous batching at batch B with ARM attached;
- ``ARM one at a time``: each prompt alone with ARM attached (how evaluations ran ARM
  conditions before ARM's statistics were per row);
- ``hf generate bB`` (without ARM: ``transformers`` has no ARM) as the common yardstick.

Every ``ARM refill`` row must equal the same prompt run alone with ARM (token for token);
targets: ``ARM refill`` >= 2.5x ``ARM one at a time`` and >= 1.5x ``hf generate bB``.

Counted tokens are the rows' lengths (the same for every method). Each method runs
``--repeats`` rounds, interleaved; medians and best runs are printed (on a busy machine the
best run is the least disturbed), then a Markdown table of the medians with each method's
ratio to ``hf generate bB`` and the extra resident memory of the run (peak RSS during the run
minus RSS before it; KV cache and activations). Targets: refill / hf generate bB >= 1.5 on
reference lengths and >= 1.0 with all rows to the cap. The script also checks that every
method's rows hold the same tokens as each prompt generated alone (``hf generate b1``);
rows of left-padded static batches may part from them after a near-tie (padding changes the
floating-point sums), rows of continuous batching are prefilled alone and should not.

``OMP_WAIT_POLICY=PASSIVE`` is set (unless already set) before torch is imported.

Usage:
    python benchmarks/eval_throughput.py --problems 32 --batch-size 8 --max-new-tokens 512 --cap 256 --repeats 2
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import copy  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

import lensprobe as lp  # noqa: E402
from lensprobe.core.models.loading import model_label, quiet  # noqa: E402
from lensprobe.evals import builtin_condition  # noqa: E402
from lensprobe.evals.problems.load import math500_path  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from procmem import reset_peak, rss_kib  # noqa: E402

TARGETS = {"reference lengths": 1.5, "all to the cap": 1.0, "reference lengths + ARM": 1.5}
ARM_TARGET = 2.5  # ARM refill vs ARM one problem at a time
ARM_WORKLOAD = "reference lengths + ARM"


def hf_rows(hf, prompts: list[list[int]], caps: list[int], batch_size: int, pad: int) -> list[list[int]]:
    """``transformers`` ``generate`` over left-padded batches in order, end-of-sequence off;
    each row cut to its own cap."""
    config = copy.deepcopy(hf.generation_config)
    # no token ends a row (None would fall back to the model's EOS): every row runs to the batch's
    # length, as lp.generate(stop_at_eos=False)
    config.eos_token_id = hf.config.vocab_size
    config.pad_token_id = pad
    config.do_sample = False
    config.temperature = config.top_p = config.top_k = None
    rows: list[list[int]] = []
    for i in range(0, len(prompts), batch_size):
        batch, lengths = prompts[i:i + batch_size], caps[i:i + batch_size]
        width = max(len(b) for b in batch)
        ids = torch.tensor([[pad] * (width - len(b)) + b for b in batch])
        mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch])
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=mask, generation_config=config, max_new_tokens=max(lengths))
        rows += [row[:n] for row, n in zip(out[:, width:].tolist(), lengths, strict=True)]
    return rows


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=512, help="longest reference length kept")
    ap.add_argument("--cap", type=int, default=256, help="every row's length in the all-to-the-cap workload")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workloads", default=f"reference lengths,all to the cap,{ARM_WORKLOAD}")
    ap.add_argument("--data", default=None, help="MATH-500 JSONL (default: the copy shipped with lensprobe)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = args.data or math500_path()
    model = lp.load_model()
    tok = model.tokenizer
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()][:args.problems]
    build = builtin_condition("w/o").prompt_builder(model)
    prompts = [build(r["problem"]).tokens[0].tolist() for r in records]
    reference = [min(args.max_new_tokens, len(tok(r["solution"])["input_ids"])) for r in records]
    workloads = {"reference lengths": reference, "all to the cap": [args.cap] * len(records), ARM_WORKLOAD: reference}
    workloads = {name: workloads[name.strip()] for name in args.workloads.split(",")}
    from transformers import AutoModelForCausalLM

    with quiet():
        hf = AutoModelForCausalLM.from_pretrained(model.original_model.name_or_path, dtype=torch.float32).eval()
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    b = args.batch_size
    print(f"model {model_label(model)}, {len(records)} MATH-500 problems (prompts {min(map(len, prompts))}-"
          f"{max(map(len, prompts))} tokens), batch {b}, greedy, torch threads {torch.get_num_threads()}")

    def lp_rows(caps, refill, interventions=()):
        out = lp.generate(model, prompts, max_new_tokens=max(caps), caps=caps, stop_at_eos=False,
                          batch_size=b, refill=refill, progress=False, interventions=list(interventions))
        return out.generated_ids, out.meta["batching"]

    def one_at_a_time(caps, interventions):
        rows = [lp.generate(model, [p], max_new_tokens=c, stop_at_eos=False, progress=False,
                            interventions=list(interventions)).generated_ids[0]
                for p, c in zip(prompts, caps, strict=True)]
        return rows, "each prompt alone"

    ref_name = f"hf generate b{b}"
    plain_methods = {
        "lensprobe refill": lambda caps: lp_rows(caps, True),
        "lensprobe static": lambda caps: lp_rows(caps, False),
        ref_name: lambda caps: (hf_rows(hf, prompts, caps, b, pad), ""),
        "hf generate b1": lambda caps: (hf_rows(hf, prompts, caps, 1, pad), ""),
    }
    arm = lp.ARM(layer=0, c=0.1, percentile=95, seed=0)
    arm_methods = {
        "ARM refill": lambda caps: lp_rows(caps, True, [arm]),
        "ARM one at a time": lambda caps: one_at_a_time(caps, [arm]),
        ref_name: lambda caps: (hf_rows(hf, prompts, caps, b, pad), ""),
    }
    lp_rows([4] * len(prompts), True)  # warm-up: first-forward allocations
    hf_rows(hf, prompts[:b], [4] * b, b, pad)
    table = []
    for workload, caps in workloads.items():
        methods = arm_methods if workload == ARM_WORKLOAD else plain_methods
        tokens = sum(caps)
        steps_static = sum(max(caps[i:i + b]) for i in range(0, len(caps), b))
        print(f"\n== {workload}: {tokens} tokens (row lengths {min(caps)}-{max(caps)}, median "
              f"{statistics.median(caps):g}); static batches of {b} step {steps_static} times for "
              f"{tokens / b:.0f} steps of useful work")
        rates: dict[str, list[float]] = {name: [] for name in methods}
        memory: dict[str, list[float]] = {name: [] for name in methods}
        outputs, notes = {}, {}
        for _ in range(args.repeats):
            for name, fn in methods.items():
                gc.collect()
                can_reset = reset_peak()
                before = rss_kib()[0]
                t0 = time.perf_counter()
                rows, note = fn(caps)
                seconds = time.perf_counter() - t0
                peak = rss_kib()[1]
                rates[name].append(tokens / seconds)
                memory[name].append((peak - before) / 1024 if can_reset else float("nan"))
                outputs[name], notes[name] = rows, note
                print(f"  {name:>17}: {seconds:7.1f} s, {rates[name][-1]:7.1f} tokens/s, +{memory[name][-1]:.0f} MiB"
                      f"{'  (' + note + ')' if note else ''}", flush=True)
        # each prompt alone: no padding, no other rows (with ARM: lensprobe with ARM, one prompt at a time)
        base = outputs["ARM one at a time" if workload == ARM_WORKLOAD else "hf generate b1"]
        for name, rows in outputs.items():
            if workload == ARM_WORKLOAD and name == ref_name:
                continue  # no ARM: other tokens
            assert [len(r) for r in rows] == caps, f"{name}: row lengths differ from the workload's"
            diffs = [first_difference(r, s) for r, s in zip(rows, base, strict=True)]
            same = sum(d is None for d in diffs)
            late = [d for d in diffs if d is not None]
            alone = "lensprobe with ARM, one prompt" if workload == ARM_WORKLOAD else "hf generate b1"
            print(f"  {name:>17}: {same}/{len(rows)} rows token-identical to the prompt alone ({alone})"
                  + (f" (the others first differ at token {', '.join(map(str, late))})" if late else ""))
        med = {name: statistics.median(v) for name, v in rates.items()}
        best = {name: max(v) for name, v in rates.items()}
        for name in methods:
            table.append((workload, name, med[name], best[name], med[name] / med[ref_name],
                          best[name] / best[ref_name], statistics.median(memory[name])))
        mine = "ARM refill" if workload == ARM_WORKLOAD else "lensprobe refill"
        ratio = med[mine] / med[ref_name]
        print(f"  {mine} / {ref_name}: {ratio:.2f}x median, {best[mine] / best[ref_name]:.2f}x "
              f"best (target >= {TARGETS[workload]})")
        if workload == ARM_WORKLOAD:
            alone = "ARM one at a time"
            print(f"  {mine} / {alone}: {med[mine] / med[alone]:.2f}x median, {best[mine] / best[alone]:.2f}x best "
                  f"(target >= {ARM_TARGET})")
    print(f"\n| workload | method | tokens/s (median) | tokens/s (best) | vs {ref_name} (median) "
          f"| vs {ref_name} (best) | extra memory |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for workload, name, m, bst, r, rb, mem in table:
        print(f"| {workload} | {name} | {m:.1f} | {bst:.1f} | {r:.2f}x | {rb:.2f}x | {mem:.0f} MiB |")


if __name__ == "__main__":
    main()
