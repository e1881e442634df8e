"""Cost of ``record=``: every layer's residual stream at the newest position, per step, against an untraced
``lp.generate`` and against ``transformers``' own ``generate(output_hidden_states=True)``.

On the embedded SmolLM2-135M-Instruct, one MATH-style prompt, ``--steps`` greedy steps (128 by default,
end of sequence ignored so every method makes the same tokens), interleaved for ``--repeats`` rounds:

- ``lp generate``: ``lp.generate`` with nothing recorded (the plain engine): (a);
- ``lp record resid_post``: the same with ``record="blocks.*.hook_resid_post"`` (30 layers x 576 values
  per step, float32);
- ``lp record norms``: ``lp.Record("blocks.*.hook_resid_post", reduce=norm)`` (30 values per step);
- ``hf generate hidden``: ``transformers`` ``generate(output_hidden_states=True, return_dict_in_generate=True)``
  on the same weights (sdpa): what plain ``transformers`` offers, every layer's hidden states kept;
- ``hf generate``: the same without hidden states, for reference.

Target: ``lp record resid_post`` <= 1.2x (a). Memory: the bytes asked for (steps x layers x d_model x 4)
against the bytes the trace holds, and the peak heap growth of each method in this process (glibc
``mallinfo2``, see ``trace_overhead.py``). The script checks that every method made the same tokens and
that the recorded residual stream equals ``transformers``' hidden states.

Usage:
    python benchmarks/recording.py --steps 128 --repeats 3
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from trace_overhead import QUESTION, peak_growth  # noqa: E402

import lensprobe as lp  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    from lensprobe.core.models.loading import converted_gguf_folder, embedded_gguf_path, quiet

    model = lp.load_model()
    with quiet():
        hf = AutoModelForCausalLM.from_pretrained(converted_gguf_folder(embedded_gguf_path()),
                                                  attn_implementation="sdpa", dtype=torch.float32).eval()
    prompt = lp.build_prompt(model, QUESTION, system=lp.MATH_SYSTEM_PROMPT)
    ids = prompt.tokens.to(hf.device)
    n = args.steps
    norm = lp.Record("blocks.*.hook_resid_post", reduce=lambda x: x.norm(dim=-1))
    gen = dict(max_new_tokens=n, stop_at_eos=False)

    def hf_generate(hidden: bool):
        with torch.inference_mode():
            return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, output_hidden_states=hidden, return_dict_in_generate=True,
                               pad_token_id=0)

    methods = {
        "lp generate": lambda: lp.generate(model, prompt, **gen),
        "lp record resid_post": lambda: lp.generate(model, prompt, record="blocks.*.hook_resid_post", **gen),
        "lp record norms": lambda: lp.generate(model, prompt, record=norm, **gen),
        "hf generate hidden": lambda: hf_generate(True),
        "hf generate": lambda: hf_generate(False),
    }
    outs = {name: fn() for name, fn in methods.items()}  # warm-up, and the outputs checked below
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeats):
        for name, fn in methods.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    memory = {name: peak_growth(fn)[0]["heap"] for name, fn in methods.items()}

    tokens = outs["lp generate"].generated_ids[0]
    for name in ("lp record resid_post", "lp record norms"):
        assert outs[name].generated_ids[0] == tokens, name
    for name in ("hf generate hidden", "hf generate"):
        assert outs[name].sequences[0, ids.shape[1]:].tolist() == tokens, name
    rec = outs["lp record resid_post"]
    hidden = outs["hf generate hidden"].hidden_states  # per step: per layer [1, pos, d]; last layer after the norm
    layers = model.cfg.n_layers
    worst = 0.0
    for t in range(n):
        for layer in range(layers - 1):  # hidden_states[layer + 1] is the output of layer `layer`
            want = hidden[t][layer + 1][0, -1]
            worst = max(worst, float((rec.activations[f"blocks.{layer}.hook_resid_post"][t] - want).abs().max()))

    base = statistics.median(times["lp generate"])
    print(f"SmolLM2-135M, {n} greedy steps, {args.repeats} rounds (median seconds; ratio to lp generate)")
    for name, ts in times.items():
        heap = memory[name]
        print(f"  {name:24s} {statistics.median(ts):7.3f} s  {statistics.median(ts) / base:5.2f}x   "
              f"peak heap growth {heap:8.1f} MiB" if heap is not None else f"  {name:24s} {statistics.median(ts):7.3f} s")
    asked = n * layers * model.cfg.d_model * 4
    held = sum(v.numel() * v.element_size() for v in rec.activations_rows.values())
    print(f"bytes asked for (steps x layers x d_model x float32): {asked / 2**20:.2f} MiB; held by the trace: "
          f"{held / 2**20:.2f} MiB; norms: {sum(v.nbytes for v in outs['lp record norms'].activations_rows.values())} B")
    print(f"recorded resid_post vs transformers' hidden states (layers 0-{layers - 2}, every step): "
          f"max |difference| {worst:.2e}")


if __name__ == "__main__":
    main()
