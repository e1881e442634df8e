"""Cost of ARM during generation: lensprobe with ARM vs without it, and vs plain ``transformers``.

On the embedded SmolLM2-135M-Instruct, one MATH-style prompt, ``--steps`` greedy steps
(end-of-sequence ignored, so every method generates the same number of tokens), this times:

- ``lp generate + ARM``: ``lp.generate(..., interventions=[ARM(layer=0, c=0.1, percentile=95,
  seed=0)])`` on the default engine: ARM's hooks sit on the gated MLP, which the plain
  Hugging Face view of the same weights serves, so it runs there;
- ``lp generate (auto)``: the same call without ARM (the same plain view);
- ``lp generate + ARM [bridge]`` and ``lp generate [bridge]``: both on ``engine="bridge"``
  (every forward through the TransformerBridge and its hook points), for ARM's cost there;
- ``hf sdpa``: ``transformers`` ``generate`` on the same weights, default sdpa attention
  (what a plain transformers user runs);
- ``hf eager``: the same with eager attention (the attention implementation the bridge uses).

Methods run interleaved for ``--repeats`` rounds; reported are the medians and minima of
wall time per generated token and the median CPU time of the process (all threads), and the
ratios ARM / no ARM (target <= 1.10x, on the bridge engine where the two differ only by ARM)
and each lensprobe method / plain ``transformers``. The script also checks that the methods
without ARM produce the same tokens and that ARM with a fixed seed repeats its tokens.

``OMP_WAIT_POLICY=PASSIVE`` is set (unless already set) before torch is imported: on a
shared machine, OpenMP's spinning threads otherwise make small forwards up to 10x slower
for every method alike, which drowns the differences being measured.

Usage:
    python benchmarks/arm_overhead.py --steps 128 --repeats 5
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import gc  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import lensprobe as lp  # noqa: E402
from lensprobe.interventions.arm import ARM  # noqa: E402

QUESTION = "Find the value of $x$ such that $\\sqrt{x + 7} = 9$. Explain each step."
TARGET = 1.10


def make_arm() -> ARM:
    return ARM(layer=0, c=0.1, percentile=95, seed=0)


def setup(steps: int):
    """Model, prompt and the timed methods (name -> zero-argument function returning generated ids)."""
    from transformers import AutoModelForCausalLM

    from lensprobe.core.models.loading import converted_gguf_folder, embedded_gguf_path, quiet

    model = lp.load_model()
    prompt = lp.build_prompt(model, QUESTION, system=lp.MATH_SYSTEM_PROMPT)
    tokens = prompt.tokens
    folder = str(converted_gguf_folder(embedded_gguf_path()))
    with quiet():
        hf_eager = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        hf_sdpa = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    for m in (hf_eager, hf_sdpa):
        m.generation_config.eos_token_id = None  # generate exactly n tokens, like stop_at_eos=False
        m.generation_config.pad_token_id = model.tokenizer.pad_token_id

    def lp_run(**kw):
        def run():
            out = lp.generate(model, prompt, max_new_tokens=steps, stop_at_eos=False, **kw)
            return out.generated_ids[0], out.meta.get("engine")
        return run

    def hf(m):
        def run():
            with torch.inference_mode():
                seq = m.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=steps,
                                 do_sample=False)
            return seq[0, tokens.shape[1]:].tolist(), "transformers"
        return run

    methods = {
        "lp generate + ARM": lp_run(interventions=[make_arm()]),
        "lp generate (auto)": lp_run(),
        "lp generate + ARM [bridge]": lp_run(interventions=[make_arm()], engine="bridge"),
        "lp generate [bridge]": lp_run(engine="bridge"),
        "hf sdpa": hf(hf_sdpa),
        "hf eager": hf(hf_eager),
    }
    return model, prompt, methods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=128, help="generated tokens per run (default 128)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per method (default 5)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n = args.steps
    model, prompt, methods = setup(n)
    print(f"model: SmolLM2-135M-Instruct ({model.cfg.n_layers} layers); prompt {len(prompt)} tokens; {n} steps, "
          f"greedy; ARM: {make_arm()}; torch threads {torch.get_num_threads()}; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; repeats {args.repeats}")

    first = {name: fn() for name, fn in methods.items()}  # warm-up, and the token checks
    engines = {name: engine for name, (_, engine) in first.items()}
    print("engines: " + ", ".join(f"{k}: {v}" for k, v in engines.items()))
    ref = first["lp generate (auto)"][0]
    plain = [name for name in methods if "ARM" not in name]
    print("same tokens without ARM: " + ", ".join(f"{k}: {'yes' if first[k][0] == ref else 'NO'}" for k in plain))
    arm_again = methods["lp generate + ARM"]()[0]
    changed = sum(a != b for a, b in zip(first["lp generate + ARM"][0], ref, strict=True))
    print(f"ARM, seed 0, run twice: {'same tokens' if arm_again == first['lp generate + ARM'][0] else 'DIFFERENT'}; "
          f"ARM changes {changed} of {n} tokens vs no ARM")
    del first

    times: dict[str, list[float]] = {name: [] for name in methods}
    cpu_times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeats):
        for name, fn in methods.items():
            gc.collect()
            t, c = time.perf_counter(), time.process_time()
            fn()
            times[name].append((time.perf_counter() - t) / n)
            cpu_times[name].append((time.process_time() - c) / n)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    best = {name: min(ts) for name, ts in times.items()}
    cpu = {name: statistics.median(ts) for name, ts in cpu_times.items()}

    print("\nper generated token (interleaved rounds; prefill included; on a shared machine the fastest round is "
          "the least disturbed one; cpu is the process's CPU time, all threads)")
    arm = "lp generate + ARM"
    print(f"{'method':<28}{'engine':<14}{'median ms':>10}{'min ms':>9}{'cpu ms':>9}{'tok/s (min)':>13}"
          f"{'ARM/this med':>14}{'ARM/this min':>14}{'this/hf sdpa':>14}")
    for name in methods:
        print(f"{name:<28}{engines[name]:<14}{med[name] * 1e3:>10.2f}{best[name] * 1e3:>9.2f}{cpu[name] * 1e3:>9.2f}"
              f"{1 / best[name]:>13.1f}{med[arm] / med[name]:>14.3f}{best[arm] / best[name]:>14.3f}"
              f"{med[name] / med['hf sdpa']:>14.3f}")

    def ratio(a: str, b: str, target: float | None = None) -> str:
        rs = (med[a] / med[b], best[a] / best[b], cpu[a] / cpu[b])
        text = f"{rs[0]:.3f}x (wall medians), {rs[1]:.3f}x (wall minima), {rs[2]:.3f}x (CPU medians)"
        if target is not None:
            ok = "meets" if max(rs) <= target else ("MISSES" if min(rs) > target else "borderline on")
            text += f" -> {ok} the <= {target}x target"
        return text

    print(f"\n  ARM vs no ARM on the default engine ({engines[arm]} vs {engines['lp generate (auto)']}): "
          f"{ratio(arm, 'lp generate (auto)', TARGET)}")
    print(f"  ARM vs no ARM, both on engine='bridge': {ratio('lp generate + ARM [bridge]', 'lp generate [bridge]', TARGET)}")
    same = methods["lp generate + ARM [bridge]"]()[0] == arm_again
    print(f"  ARM gives the same tokens on both engines: {'yes' if same else 'NO'}")
    print(f"  engine='bridge' vs default engine, no ARM: {ratio('lp generate [bridge]', 'lp generate (auto)')}")
    for name in ("lp generate + ARM", "lp generate (auto)", "lp generate + ARM [bridge]", "lp generate [bridge]"):
        print(f"  {name} vs hf sdpa generate: {ratio(name, 'hf sdpa')}; vs hf eager: {ratio(name, 'hf eager')}")


if __name__ == "__main__":
    main()
