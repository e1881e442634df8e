"""Overhead of capturing attention with lensprobe, vs a bare forward of the same prompt.

On the embedded SmolLM2-135M-Instruct and a prompt of about ``--tokens`` tokens (the
paper's system prompt, 55 "/" filler tokens, and a long question), this times:

- ``bare``: the TransformerBridge forward (``torch.inference_mode``), no hooks;
- ``bare no unembed``: the same, ended before the final norm and the unembedding (which
  ``attention_patterns`` never runs), to show the capture overhead on its own;
- ``lp L0``: ``lp.attention_patterns(model, prompt, layers=[0])`` + the metrics
  (average attention received and attention proportion onto the filler);
- ``lp L{last}``: the same for the last layer only (the whole stack has to run);
- ``lp all``: the same for every layer;
- ``hf eager`` / ``hf eager+attn`` / ``hf sdpa``: plain ``transformers`` forwards of the
  same weights (eager, eager with ``output_attentions=True``, and sdpa).

Methods run interleaved, ``--repeats`` rounds, and the medians are compared; the ratios
to ``bare`` are printed (target for lensprobe: <= 1.15x). Memory: the peak resident set
size (``VmHWM``, reset before each call through ``/proc/self/clear_refs``) above the
resident size before the call, and the bytes of the patterns lensprobe keeps vs one
layer's pattern and all layers' patterns.

Usage:
    python benchmarks/attention_overhead.py --tokens 1000 --repeats 5
"""

import argparse
import gc
import statistics
import time

import torch
from procmem import reset_peak, rss_kib

import lensprobe as lp

SENTENCE = (
    "A rectangle has a perimeter of 56 centimetres and its length is three times its width; "
    "find the area of the rectangle, then the length of its diagonal, and explain each step."
)


def build_long_prompt(model, n_tokens: int) -> lp.Prompt:
    """System prompt + 55 "/" filler + a question made long enough for ``n_tokens`` in total."""
    words: list[str] = []
    vocab = SENTENCE.split()
    prompt = None
    while True:
        candidate = lp.build_prompt(model, " ".join(words + [vocab[len(words) % len(vocab)]]),
                                    system=lp.MATH_SYSTEM_PROMPT, filler=lp.Filler.meaningless())
        if len(candidate) > n_tokens and prompt is not None:
            return prompt
        words.append(vocab[len(words) % len(vocab)])
        prompt = candidate


def metrics_of(patterns: dict, prompt: lp.Prompt) -> list[torch.Tensor]:
    filler = prompt.positions("filler")
    return [(lp.metrics.average_attention_received(p), lp.metrics.attention_proportion(p, filler)) for p in patterns.values()]


def peak_and_kept(fn) -> tuple[float, float, object]:
    """MiB above the starting RSS: the peak during ``fn()`` and what stays while its result lives."""
    gc.collect()
    before, _ = rss_kib()
    reset_peak()
    out = fn()
    after, peak = rss_kib()
    return (peak - before) / 1024, (after - before) / 1024, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1000, help="prompt length in tokens (about)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per method")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--no-hf", action="store_true", help="skip the plain transformers baselines")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from lensprobe.core.models.loading import converted_gguf_folder, embedded_gguf_path, quiet

    t0 = time.perf_counter()
    model = lp.load_model()
    load_s = time.perf_counter() - t0
    prompt = build_long_prompt(model, args.tokens)
    tokens = prompt.tokens
    n_layers, n_heads, pos = model.cfg.n_layers, model.cfg.n_heads, len(prompt)
    last = n_layers - 1
    print(f"model: SmolLM2-135M-Instruct ({n_layers} layers, {n_heads} heads), loaded in {load_s:.1f} s; "
          f"prompt: {pos} tokens ({len(prompt.positions('filler'))} filler); torch threads: "
          f"{torch.get_num_threads()}; repeats: {args.repeats}")

    def bare():
        with torch.inference_mode():
            return model(tokens)

    class _Stop(Exception):
        pass

    def stop(act, hook):
        raise _Stop

    def bare_blocks():
        """The bare forward without the final norm and unembedding, which lensprobe skips."""
        try:
            with torch.inference_mode(), lp.intervene(model, ("ln_final.hook_in", stop)):
                model(tokens)
        except _Stop:
            pass

    def lp_layers(layers):
        def run():
            pats = lp.attention_patterns(model, prompt, layers=layers)
            return pats, metrics_of(pats, prompt)
        return run

    methods = {
        "bare": bare,
        "bare no unembed": bare_blocks,
        "lp L0": lp_layers([0]),
        f"lp L{last}": lp_layers([last]),
        "lp all": lp_layers(None),
    }
    if not args.no_hf:
        folder = converted_gguf_folder(embedded_gguf_path())
        with quiet():
            hf_eager = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
            hf_sdpa = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()

        def hf(m, **kw):
            def run():
                with torch.inference_mode():
                    return m(tokens, **kw)
            return run

        methods.update({
            "hf eager": hf(hf_eager),
            "hf eager+attn": hf(hf_eager, output_attentions=True),
            "hf sdpa": hf(hf_sdpa),
        })

    for fn in methods.values():  # warm-up
        fn()
    wall: dict[str, list[float]] = {name: [] for name in methods}
    cpu: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeats):
        for name, fn in methods.items():
            gc.collect()
            t, c = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    base_wall, base_cpu = statistics.median(wall["bare"]), statistics.median(cpu["bare"])
    print("\ntime (median of interleaved rounds; CPU time is the process's, steadier on a busy machine)")
    print(f"{'method':<16}{'wall s':>9}{'min s':>9}{'x bare':>9}{'cpu s':>9}{'x bare':>9}")
    for name in methods:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"{name:<16}{w:>9.3f}{min(wall[name]):>9.3f}{w / base_wall:>9.2f}{c:>9.3f}{c / base_cpu:>9.2f}")
    for name in ("lp L0", f"lp L{last}", "lp all"):
        rw = statistics.median(wall[name]) / base_wall
        rc = statistics.median(cpu[name]) / base_cpu
        verdict = "meets" if max(rw, rc) <= 1.15 else "MISSES"
        print(f"  {name}: {rw:.2f}x bare (wall), {rc:.2f}x (cpu) -> {verdict} the 1.15x target")
    blocks_cpu = statistics.median(cpu["bare no unembed"])
    for name in (f"lp L{last}", "lp all"):
        print(f"  {name} vs the forward without unembedding: "
              f"{statistics.median(cpu[name]) / blocks_cpu:.2f}x (cpu): the capture + metrics cost alone")

    print("\nmemory (MiB above the resident size before the call)")
    if not reset_peak():
        print("  /proc/self/clear_refs is not writable here: peak figures are not available")
    one_layer = n_heads * pos * pos * 4 / 2**20
    print(f"  one layer's pattern [head, q, k] float32: {one_layer:.1f} MiB; all {n_layers} layers: "
          f"{one_layer * n_layers:.1f} MiB")
    print(f"{'method':<16}{'peak':>9}{'kept':>9}   patterns held (MiB)")
    for name, fn in methods.items():
        peak, kept, out = peak_and_kept(fn)
        held = ""
        if name.startswith("lp"):
            pats = out[0]
            held = f"{sum(p.nbytes for p in pats.values()) / 2**20:.1f} ({len(pats)} layers)"
        elif isinstance(getattr(out, "attentions", None), tuple):
            held = f"{sum(a.nbytes for a in out.attentions) / 2**20:.1f} ({len(out.attentions)} layers)"
        print(f"{name:<16}{peak:>9.1f}{kept:>9.1f}   {held}")
        del out
    print("\n'kept' is the resident growth while the result is alive (logits for bare/hf, "
          "patterns + metrics for lp); 'patterns held' counts the attention tensors returned.")


if __name__ == "__main__":
    main()
