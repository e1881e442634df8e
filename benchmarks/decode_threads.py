"""Decode steps with the decoder layers on one thread vs torch's thread count, by model size.

A decode step multiplies every weight matrix by one vector per row: it streams the
weights from memory. For small matrices, waking torch's other threads costs more than
they save; :func:`lensprobe.generation.engines.threads.decode_threads` therefore runs the layers of small
models on one thread in decode steps (the unembedding keeps torch's count). This script
measures where that pays off on this machine, to set ``threads.ONE_THREAD_LAYER_BYTES``:

- Llama models with random weights and the shapes of SmolLM2-135M (576/1536), SmolLM2-360M
  (960/2560), a 1536/4096 model and a 2048/8192 model (fewer layers for the larger ones:
  the question is the per-matrix cost), through ``transformers`` ``generate`` (sdpa), with
  and without :func:`lensprobe.generation.engines.threads.layer_threads` (one thread);
- the embedded SmolLM2-135M-Instruct through ``lp.generate`` with the rule on and off
  (``threads.ONE_THREAD_LAYER_BYTES = 0``).

Times per generated token are best of ``--repeats``; ratios > 1 mean one thread is faster.

Usage:
    python benchmarks/decode_threads.py --steps 32 --repeats 3
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import lensprobe as lp  # noqa: E402
from lensprobe.generation.engines import threads  # noqa: E402

SHAPES = [(576, 1536, 30, 9, 3), (960, 2560, 16, 15, 5), (1536, 4096, 8, 12, 4), (2048, 8192, 4, 32, 8)]


def best(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def random_llama(hidden: int, inter: int, layers: int, heads: int, kv: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, vocab_size=49152,
                         tie_word_embeddings=True, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=32, help="generated tokens per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8])
    args = parser.parse_args()
    n = args.steps
    print(f"torch threads: {torch.get_num_threads()}; ms per step, best of {args.repeats}")
    for shape in SHAPES:
        model = random_llama(*shape)
        largest = shape[0] * shape[1] * 4 / 2**20
        for batch in args.batches:
            ids = torch.randint(0, 49152, (batch, 60))

            def run(model=model, ids=ids):
                with torch.inference_mode():
                    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)

            def one(model=model, run=run):
                with threads.layer_threads(model, 1):
                    run()

            many, single = best(run, args.repeats), best(one, args.repeats)
            print(f"hidden {shape[0]:5d} mlp {shape[1]:5d} (largest weight {largest:5.1f} MiB) batch {batch:2d}: "
                  f"torch's threads {many / n * 1e3:6.1f}  one thread {single / n * 1e3:6.1f}  "
                  f"-> one thread {many / single:.2f}x as fast", flush=True)
        del model
    model = lp.load_model()
    prompt = lp.build_prompt(model, "Find $x$ such that $\\sqrt{x + 7} = 9$.", system=lp.MATH_SYSTEM_PROMPT)
    limit = threads.ONE_THREAD_LAYER_BYTES
    for batch in args.batches:
        def gen(on: bool, batch=batch):
            threads.ONE_THREAD_LAYER_BYTES = limit if on else 0
            try:
                return lp.generate(model, [prompt] * batch, max_new_tokens=n, stop_at_eos=False)
            finally:
                threads.ONE_THREAD_LAYER_BYTES = limit

        rule = gen(True).meta["decode_threads"]
        off, on = best(lambda: gen(False), args.repeats), best(lambda: gen(True), args.repeats)
        print(f"embedded SmolLM2-135M lp.generate batch {batch:2d}: rule off {off / n * 1e3:6.1f}  "
              f"rule on ({rule} thread(s)) {on / n * 1e3:6.1f}  -> {off / on:.2f}x", flush=True)


if __name__ == "__main__":
    main()
