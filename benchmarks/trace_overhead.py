"""Overhead of tracing a generation with lensprobe, vs generating without recorders and vs transformers.

On the embedded SmolLM2-135M-Instruct, one MATH-style prompt, ``--steps`` greedy steps
(256 by default; end-of-sequence ignored so every method generates the same tokens), this
times:

- ``lp trace``: ``lp.trace_generation`` recording, at every step, the entropy and the
  attention proportion onto two tracked sets at every layer and head (30 x 9), default
  engine (with no interventions: the bridge's weights through the unwrapped Hugging Face
  modules, :mod:`lensprobe.generation.engines.view`, with fused sdpa attention plus each layer's newest-query
  attention row computed from the cached keys; in decode steps the decoder layers of a
  model this small run on one thread, the unembedding on torch's threads);
- ``lp generate``: the same loop with no recorders (``lp.generate``, ``track=None``): (a);
- ``lp trace [bridge]`` and ``lp generate [bridge]``: the same two on ``engine="bridge"``
  (every forward through the TransformerBridge and its hook points, as with interventions);
- ``bridge KV loop``: a hand-written greedy loop of bridge forwards with the KV cache and no
  hooks (what any KV-cached loop on a ``TransformerBridge`` costs), for reference;
- ``bridge generate``: TransformerLens' own ``model.generate`` (KV cache), for reference;
- ``hf sdpa``: ``transformers`` ``generate`` on the same weights, sdpa attention: (b);
- ``hf eager+attn+scores``: ``transformers`` ``generate(output_attentions=True,
  output_scores=True)`` with eager attention: (c);
- ``hf sdpa [1-thread layers]``: (b) with its decoder layers on one thread in decode steps,
  as lensprobe's default engine runs a model this small (:func:`lensprobe.generation.engines.threads.decode_threads`),
  for reference: it shows how much of the difference to (b) and (c) that choice makes.

Methods run interleaved for ``--repeats`` rounds; wall-time medians and minima and the
medians of the process's CPU time (all threads) are compared. Targets:
``lp trace`` <= 1.15x (a) and <= 1.0x (c). Memory: each method runs once more in a fresh
process (after a short warm-up); reported are the peak of the C heap in use during the
call (glibc ``mallinfo2``, sampled every 0.5 ms) above the heap in use before it, the same
for the resident set size (``VmHWM``, reset through ``/proc/self/clear_refs``; freed memory
that the allocator keeps makes this one undercount), and the process's peak resident size.
Target: the trace's peak heap growth <= 1.10x that of (a). The script also checks that
every method produced the same tokens.

``OMP_WAIT_POLICY=PASSIVE`` is set (unless already set) before torch is imported: on a
shared machine, OpenMP's spinning threads otherwise make small forwards up to 10x slower
for every method alike, which drowns the differences being measured.

Usage:
    python benchmarks/trace_overhead.py --steps 256 --repeats 3
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import ctypes  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from procmem import reset_peak, rss_kib  # noqa: E402

import lensprobe as lp  # noqa: E402
from lensprobe.generation.engines import threads  # noqa: E402

QUESTION = "Find the value of $x$ such that $\\sqrt{x + 7} = 9$. Explain each step."


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_in_use_mib() -> float | None:
    """Bytes the C heap has handed out and not freed (glibc ``mallinfo2``), in MiB; None elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return None
    info = libc.mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20


class HeapPeak(threading.Thread):
    """Samples the heap in use every half millisecond while a call runs; keeps the peak."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak = heap_in_use_mib() or 0.0
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            self.peak = max(self.peak, heap_in_use_mib() or 0.0)
            time.sleep(0.0005)


def peak_growth(fn) -> tuple[dict, object]:
    """Peak heap in use and peak resident size during ``fn()``, above their values before it (MiB)."""
    gc.collect()
    heap_before = heap_in_use_mib()
    rss_before, _ = rss_kib()
    reset_peak()
    sampler = HeapPeak()
    sampler.start()
    try:
        out = fn()
    finally:
        sampler.done.set()
        sampler.join()
    _, rss_peak = rss_kib()
    heap = None if heap_before is None else max(sampler.peak, heap_in_use_mib()) - heap_before
    return {"heap": heap, "rss": (rss_peak - rss_before) / 1024, "peak_total": rss_peak / 1024}, out


def setup(steps: int):
    """Model, prompt and the timed methods (name -> zero-argument function)."""
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

    def methods_for(n: int) -> dict:
        def lp_trace():
            return lp.trace_generation(model, prompt, max_new_tokens=n, track=TRACK, stop_at_eos=False)

        def lp_generate():
            return lp.generate(model, prompt, max_new_tokens=n, stop_at_eos=False)

        def lp_trace_bridge():
            return lp.trace_generation(model, prompt, max_new_tokens=n, track=TRACK, stop_at_eos=False,
                                       engine="bridge")

        def lp_generate_bridge():
            return lp.generate(model, prompt, max_new_tokens=n, stop_at_eos=False, engine="bridge")

        def bridge_loop():
            with torch.inference_mode():
                logits, pkv = model(tokens, return_type="logits_and_cache")
                out = [logits[:, -1].argmax(-1, keepdim=True)]
                for _ in range(n - 1):
                    logits, pkv = model(out[-1], past_key_values=pkv, return_type="logits_and_cache")
                    out.append(logits[:, -1].argmax(-1, keepdim=True))
            return torch.cat([tokens] + out, dim=1)

        def bridge_generate():
            with torch.inference_mode():
                return model.generate(tokens, max_new_tokens=n, do_sample=False, stop_at_eos=False,
                                      verbose=False, return_type="tokens", use_past_kv_cache=True)

        def hf(m, **kw):
            def run():
                with torch.inference_mode():
                    return m.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=n,
                                      do_sample=False, **kw)
            return run

        def hf_one_thread_layers():
            with threads.layer_threads(hf_sdpa, 1):
                return hf(hf_sdpa)()

        return {
            "lp trace": lp_trace,
            "lp generate (a)": lp_generate,
            "lp trace [bridge]": lp_trace_bridge,
            "lp generate [bridge]": lp_generate_bridge,
            "bridge KV loop": bridge_loop,
            "bridge generate": bridge_generate,
            "hf sdpa (b)": hf(hf_sdpa),
            "hf eager+attn+scores (c)": hf(hf_eager, output_attentions=True, output_scores=True,
                                           return_dict_in_generate=True),
            "hf sdpa [1-thread layers]": hf_one_thread_layers,
        }

    return model, prompt, methods_for


TRACK = {"system": "system", "generated": "generated"}


def measure_memory(name: str, steps: int) -> None:
    """Run one method in this (fresh) process and print its peak growth (MiB) and resident size."""
    model, prompt, methods_for = setup(steps)
    methods_for(4)[name]()  # warm-up: lazy initialisation, kernels
    mem, out = peak_growth(methods_for(steps)[name])
    print(json.dumps(mem))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=256, help="generation steps (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per method")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory measurements")
    parser.add_argument("--memory-of", default=None, help=argparse.SUPPRESS)  # internal: one method
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_of:
        measure_memory(args.memory_of, args.steps)
        return

    n = args.steps
    model, prompt, methods_for = setup(n)
    methods = methods_for(n)
    print(f"model: SmolLM2-135M-Instruct ({model.cfg.n_layers} layers x {model.cfg.n_heads} heads); prompt "
          f"{len(prompt)} tokens; {n} steps, greedy; tracked sets: {list(TRACK)} at every layer and head; "
          f"torch threads {torch.get_num_threads()}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; "
          f"repeats {args.repeats}")

    def ids_of(name, out) -> list[int]:
        if name.startswith("lp"):
            return out.generated_ids[0]
        seq = out.sequences if hasattr(out, "sequences") else out
        return seq[0, len(prompt):].tolist()

    outs = {name: fn() for name, fn in methods.items()}  # warm-up, and the token check
    outs_engine = outs["lp trace"].meta["engine"]
    decode_threads = outs["lp trace"].meta["decode_threads"]
    ref = ids_of("lp trace", outs["lp trace"])
    same = {name: ids_of(name, o) == ref for name, o in outs.items()}
    print("same tokens as lp trace: " + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in same.items()))
    del outs

    times: dict[str, list[float]] = {name: [] for name in methods}
    cpu_times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeats):
        for name, fn in methods.items():
            gc.collect()
            t, c = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - t)
            cpu_times[name].append(time.process_time() - c)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    best = {name: min(ts) for name, ts in times.items()}
    cpu = {name: statistics.median(ts) for name, ts in cpu_times.items()}
    print("\ntime (interleaved rounds; on a shared machine the fastest round is the least disturbed one; cpu s is "
          "the process's CPU time, all threads, which other jobs on the machine disturb less than wall time)")
    print(f"{'method':<28}{'median s':>10}{'min s':>9}{'cpu s med':>11}{'tok/s (min)':>13}"
          f"{'trace/this med':>16}{'trace/this min':>16}{'trace/this cpu':>16}")
    for name in times:
        print(f"{name:<28}{med[name]:>10.2f}{best[name]:>9.2f}{cpu[name]:>11.2f}{n / best[name]:>13.1f}"
              f"{med['lp trace'] / med[name]:>16.2f}{best['lp trace'] / best[name]:>16.2f}"
              f"{cpu['lp trace'] / cpu[name]:>16.2f}")

    def verdict(other: str, target: float, label: str) -> None:
        r_med, r_min, r_cpu = med["lp trace"] / med[other], best["lp trace"] / best[other], cpu["lp trace"] / cpu[other]
        ratios = (r_med, r_min, r_cpu)
        ok = "meets" if max(ratios) <= target else ("MISSES" if min(ratios) > target else "borderline on")
        print(f"  lp trace vs {label}: {r_med:.3f}x (wall medians), {r_min:.3f}x (wall minima), {r_cpu:.3f}x "
              f"(CPU-time medians) -> {ok} the <= {target}x target")

    verdict("lp generate (a)", 1.15, "(a) lp generate, no recorders")
    r_med = med["lp trace [bridge]"] / med["lp generate [bridge]"]
    r_min = best["lp trace [bridge]"] / best["lp generate [bridge]"]
    print(f"  on engine='bridge': lp trace vs lp generate, no recorders: {r_med:.3f}x (medians), {r_min:.3f}x "
          "(minima); target <= 1.15x")
    verdict("hf eager+attn+scores (c)", 1.0, "(c) hf generate(output_attentions, output_scores)")
    print(f"  lp trace vs (b) hf generate sdpa: {med['lp trace'] / med['hf sdpa (b)']:.3f}x (medians), "
          f"{best['lp trace'] / best['hf sdpa (b)']:.3f}x (minima); no target")
    print(f"  lp trace vs hf generate sdpa with 1-thread layers: "
          f"{med['lp trace'] / med['hf sdpa [1-thread layers]']:.3f}x (medians), "
          f"{best['lp trace'] / best['hf sdpa [1-thread layers]']:.3f}x (minima); reference, no target "
          f"(lp trace's decode threads: {decode_threads})")
    print(f"  bridge KV loop (no lensprobe) vs (c): {best['bridge KV loop'] / best['hf eager+attn+scores (c)']:.3f}x "
          f"(minima): the TransformerBridge's own cost per step, which the default engine avoids; "
          f"lp trace vs bridge KV loop: {best['lp trace'] / best['bridge KV loop']:.3f}x (minima)")
    print(f"  engines: lp trace ran on {outs_engine!r}; lp trace [bridge] / lp trace: "
          f"{med['lp trace [bridge]'] / med['lp trace']:.3f}x (medians)")
    if args.no_memory:
        return

    print("\nmemory: each method once more in a fresh process (MiB): peak heap in use during the call above the "
          "heap in use before it (glibc mallinfo2, sampled every 0.5 ms), the same for the resident size, and the "
          "process's peak resident size")
    if not reset_peak():
        print("  /proc/self/clear_refs is not writable here: resident peaks are not available")
    mem = {}
    print(f"{'method':<28}{'heap peak':>10}{'RSS peak':>10}{'process':>9}")
    for name in methods:
        cmd = [sys.executable, __file__, "--steps", str(n), "--memory-of", name]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        mem[name] = json.loads(res.stdout.strip().splitlines()[-1])
        heap = mem[name]["heap"]
        print(f"{name:<28}{'n/a' if heap is None else f'{heap:.1f}':>10}{mem[name]['rss']:>10.1f}"
              f"{mem[name]['peak_total']:>9.0f}")
    a, t = mem["lp generate (a)"], mem["lp trace"]
    ab, tb = mem["lp generate [bridge]"], mem["lp trace [bridge]"]
    if ab["heap"] is not None:
        g = tb["heap"] / max(ab["heap"], 1e-9)
        print(f"  on engine='bridge': lp trace vs lp generate: peak heap growth {g:.3f}x "
              f"({tb['heap'] - ab['heap']:+.2f} MiB)")
    if a["heap"] is not None:
        g = t["heap"] / max(a["heap"], 1e-9)
        print(f"  lp trace vs (a): peak heap growth {g:.3f}x ({t['heap'] - a['heap']:+.2f} MiB) -> "
              f"{'meets' if g <= 1.10 else 'MISSES'} the <= 1.10x target")
    tot = t["peak_total"] / a["peak_total"]
    print(f"  lp trace vs (a): process peak resident size {tot:.3f}x")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    kept = n * L * H * len(TRACK) * 4 / 2**20
    hf_attn = (L * H * len(prompt) ** 2 + sum(L * H * (len(prompt) + t) for t in range(1, n))) * 4 / 2**20
    print(f"  the trace keeps {n} steps x {L} layers x {H} heads x {len(TRACK)} sets x 4 bytes = {kept:.2f} MiB of "
          f"attention; transformers' output_attentions returns {hf_attn:.1f} MiB")


if __name__ == "__main__":
    main()
