"""The numbers of docs/numerics.md ("The two engines, and ARM"; "The cost of identifying a run"), on the
embedded model: how far the plain engine's entropies are from the bridge's with and without a seeded ARM, and
how long the weights digest a resumable run computes at its start takes.

    python benchmarks/engines_and_identity.py
"""

import hashlib
import time

import torch

import lensprobe as lp
from lensprobe.core.storage.identity import weights_digest

QUESTIONS = ["What is 2+3? Answer briefly.", "What is 7 times 8?", "Name the capital of France.", "Solve x+4=10.",
             "What is the square root of 81?", "Compute 15% of 200.", "Is 17 prime?", "What is 12 divided by 4?"]


def agreeing_steps(a, b) -> int:
    """Steps while the two generations' tokens agree (the step where they part included)."""
    ta, tb = a.token_ids.reshape(-1).tolist(), b.token_ids.reshape(-1).tolist()
    return next((i + 1 for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), min(len(ta), len(tb)))


def engines(model) -> None:
    arm = lp.ARM(c=0.1, percentile=95, seed=0)
    for name, interventions in (("ARM", [arm]), ("no intervention", [])):
        worst, equal = 0.0, 0
        for question in QUESTIONS:
            prompt = lp.build_prompt(model, question)
            plain, bridge = (lp.generate(model, [prompt], max_new_tokens=32, interventions=interventions, engine=e)
                             for e in ("hf", "bridge"))
            k = agreeing_steps(plain, bridge)
            worst = max(worst, float((plain.entropy[:k] - bridge.entropy[:k]).abs().nan_to_num(0).max()))
            equal += plain.token_ids.tolist() == bridge.token_ids.tolist()
        print(f"{name}: max |entropy hf - bridge| {worst:.3g} nats while tokens agree; equal tokens on {equal} of "
              f"{len(QUESTIONS)} prompts")


def digest_cost(model) -> None:
    size = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    start = time.perf_counter()
    weights_digest(model)
    seconds = time.perf_counter() - start
    print(f"weights digest: {size / 1e6:.0f} MB in {seconds:.2f} s ({size / seconds / 1e9:.2f} GB/s); a 7B model "
          f"in bf16 (14 GB): about {14e9 / (size / seconds):.0f} s")
    data = torch.randn(2**25).numpy().tobytes()
    for algorithm in ("sha256", "blake2b"):
        start = time.perf_counter()
        hashlib.new(algorithm, data).hexdigest()
        print(f"{algorithm}: {len(data) / (time.perf_counter() - start) / 1e9:.2f} GB/s")


if __name__ == "__main__":
    model = lp.load_model()
    digest_cost(model)
    engines(model)
