"""Why attribution misses a head: how far its ablation is from the linear regime, and through what.

On the embedded SmolLM2-135M-Instruct and ``--prompts`` MATH-500 problems (as
``benchmarks/attribution.py``: chat template, lensprobe's MATH system prompt, next-token
entropy at the last prompt position), for each head of ``--heads`` and averaged over the
prompts, this prints

- ``AtP`` and ``AtP*``: ``lp.attribute_heads`` for those heads (zero ablation);
- ``slope``: the central difference of the entropy when the head's output is scaled by
  ``1 -+ 0.01`` (divided by 0.02): the derivative AtP estimates, measured without gradients;
- ``quarter``, ``half``, ``exact``: the exact change when the head's output is scaled down by a
  quarter, by half, and zeroed (the ablation);
- ``MLPs held``, ``attn held``, ``both held``: the exact change of the ablation while every
  later MLP (from the head's own layer on), every later attention layer, or both keep their
  clean outputs: which later components carry the effect.

A head whose slope agrees with AtP but whose exact change is far from it is outside the linear
regime; one whose change appears only when both MLPs and attention layers respond runs through
chains of them, which neither AtP nor AtP*'s QK fix (exact only at each later attention layer's
direct input) follows.

``OMP_WAIT_POLICY=PASSIVE`` is set (unless already set) before torch is imported: on a
shared machine, OpenMP's spinning threads otherwise make the many small operations of AtP*'s
local passes many times slower.

Usage:
    python benchmarks/attribution_misses.py --prompts 16 --heads L0H3,L1H0,L1H5
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402

import torch  # noqa: E402

import lensprobe as lp  # noqa: E402
from lensprobe.core.hooks.attach import intervene  # noqa: E402
from lensprobe.core.measures.metrics import entropy  # noqa: E402


def scale(head: int, factor: float):
    def hook(z, hook):
        z = z.clone()
        z[:, :, head] = z[:, :, head] * factor
        return z
    return hook


def hold(store: dict, name: str):
    return lambda x, hook: store[name]


def _keep(store: dict, name: str):
    def hook(x, hook):
        store[name] = x.clone()
    return hook


def run(model, tokens, hooks) -> float:
    with torch.no_grad(), intervene(model, *hooks):
        return float(entropy(model(tokens)[:, -1]).double())


def effects(model, tokens, layer: int, head: int) -> list[float]:
    """[slope, quarter, half, exact, MLPs held, attn held, both held] for one prompt."""
    n = int(model.cfg.n_layers)
    mlps = [f"blocks.{i}.hook_mlp_out" for i in range(layer, n)]
    attns = [f"blocks.{i}.hook_attn_out" for i in range(layer + 1, n)]
    clean: dict = {}
    with torch.no_grad(), intervene(model, *[(name, _keep(clean, name)) for name in mlps + attns]):
        base = float(entropy(model(tokens)[:, -1]).double())
    z = f"blocks.{layer}.attn.hook_z"
    out = [(run(model, tokens, [(z, scale(head, 0.99))]) - run(model, tokens, [(z, scale(head, 1.01))])) / 0.02]
    out += [run(model, tokens, [(z, scale(head, f))]) - base for f in (0.75, 0.5, 0.0)]
    for held in (mlps, attns, mlps + attns):
        out.append(run(model, tokens, [(z, scale(head, 0.0))] + [(name, hold(clean, name)) for name in held]) - base)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--heads", default="L0H3,L1H0,L1H5", help="heads as L<layer>H<head>, comma-separated")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = lp.load_model()
    problems = lp.load_math500(limit=args.prompts, seed=0)
    prompts = [lp.build_prompt(model, p.problem, system=lp.MATH_SYSTEM_PROMPT) for p in problems]
    atp = lp.attribute_heads(model, prompts, "entropy", heads=args.heads)
    star = lp.attribute_heads(model, prompts, "entropy", method="atp*", heads=args.heads)
    print(f"{len(prompts)} MATH-500 prompts, zero ablation, next-token entropy; means over prompts (nats)")
    cols = ["AtP", "AtP*", "slope", "quarter", "half", "exact", "MLPs held", "attn held", "both held"]
    print("head   " + " ".join(f"{c:>9s}" for c in cols))
    for i, ((layer, heads), label) in enumerate(zip(atp.units, atp.labels, strict=True)):
        rows = torch.tensor([effects(model, p.tokens, layer, heads[0]) for p in prompts]).mean(0)
        values = [float(atp.estimates[:, i].mean()), float(star.estimates[:, i].mean()), *rows.tolist()]
        print(f"{label:6s} " + " ".join(f"{v:+9.3f}" for v in values), flush=True)


if __name__ == "__main__":
    main()
