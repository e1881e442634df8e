"""AtP*'s two terms on a model with MLPs, RMSNorm and RoPE (the tiny Llama, its attention weights scaled up
so the terms are far from zero; a logit difference, whose size does not vanish on a random model's flat
distribution), each against plain transformers by hand: GradDrop's term is the derivative of the metric with that layer's block held at its clean output,
and the QK fix's term at a later layer is what that layer's attention does exactly with the head's write
added at its input, minus its linearisation."""

import pytest
import torch
from oracles import hf_head_gradients

import lensprobe as lp
from lensprobe.core.measures.forced import resolve_measures
from lensprobe.core.models.testing import tiny_model
from lensprobe.experiments.atp import attribute_prompt

EPS = 1e-3


def metric(logits: torch.Tensor) -> torch.Tensor:
    """The oracle's metric on ``[pos, vocab]`` logits."""
    return logits[-1, 3].double() - logits[-1, 7].double()


@pytest.fixture(scope="module")
def model():
    m = tiny_model(seed=0)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "attn" in name and "norm" not in name:
                p.mul_(3.0)
    return m


@pytest.fixture(scope="module")
def setup(model):
    prompt = lp.build_prompt(model, "What is 12+7?", system="Please reason step by step.")
    measure = resolve_measures(model, lambda logits, p: logits[:, -1, 3] - logits[:, -1, 7], 1)[0]
    units = [(0, (h,)) for h in range(int(model.cfg.n_heads))]
    part = attribute_prompt(model, measure.inputs(model, prompt), measure, prompt, units, None, None, qk_fix=True,
                            grad_drop=True, batch_size=4)
    return prompt, units, part


def run(hf, tokens, *hooks) -> float:
    handles = [module.register_forward_pre_hook(fn) if kind == "pre" else module.register_forward_hook(fn)
               for kind, module, fn in hooks]
    try:
        with torch.no_grad():
            return float(metric(hf(tokens).logits[0]))
    finally:
        for h in handles:
            h.remove()


def scale_head(cols: slice, factor: float):
    def pre(module, args):
        x = args[0].clone()
        x[..., cols] = x[..., cols] * factor
        return (x,)
    return pre


def test_graddrop_term_is_the_derivative_with_the_block_held_at_its_clean_output(model, twin_of, setup):
    prompt, units, part = setup
    hf = twin_of(model)
    block = hf.model.layers[1]
    seen = {}
    run(hf, prompt.tokens, ("pre", block, lambda m, args, kw=None: seen.__setitem__("in", args[0].detach())),
        ("fwd", block, lambda m, args, out: seen.__setitem__("out", (out[0] if isinstance(out, tuple) else out).detach())))
    delta = seen["out"] - seen["in"]  # layer 1's block: its attention and MLP writes on the clean run
    state = {}

    def keep_input(module, args):
        state["in"] = args[0]

    def held(module, args, out):  # the skip connection alone carries a change through layer 1
        fixed = state["in"] + delta
        return (fixed, *out[1:]) if isinstance(out, tuple) else fixed

    d_head = int(model.cfg.d_head)
    o_proj = hf.model.layers[0].self_attn.o_proj
    for i, (_, (head,)) in enumerate(units):
        cols = slice(head * d_head, (head + 1) * d_head)
        # zero ablation: dz = -z, so z + e*dz scales the head's output by 1 - e
        up = run(hf, prompt.tokens, ("pre", o_proj, scale_head(cols, 1 - EPS)), ("pre", block, keep_input),
                 ("fwd", block, held))
        down = run(hf, prompt.tokens, ("pre", o_proj, scale_head(cols, 1 + EPS)), ("pre", block, keep_input),
                   ("fwd", block, held))
        want = (up - down) / (2 * EPS)
        assert float(part.dropped[1, i]) == pytest.approx(want, rel=1e-2, abs=1e-4), head
    assert part.dropped[1].abs().min() > 1e-3  # every term far from zero
    full = part.linear  # the term without dropping differs: layer 1's block carries part of the effect
    assert (full - part.dropped[1]).abs().max() > 1e-2


def test_qk_fix_term_is_the_later_attention_exactly_minus_its_linearisation(model, twin_of, setup):
    prompt, units, part = setup
    hf = twin_of(model)
    zs, grads, _ = hf_head_gradients(hf, prompt.tokens, metric)
    g1 = grads[1][0].double()  # dM/dz at layer 1 (o_proj input, heads concatenated)
    d_head = int(model.cfg.d_head)
    w_o = hf.model.layers[0].self_attn.o_proj.weight.detach()
    norm, attn = hf.model.layers[1].input_layernorm, hf.model.layers[1].self_attn

    def z1_with(write: torch.Tensor) -> torch.Tensor:
        got = {}
        hooks = [("pre", norm, lambda m, args: (args[0] + write,)),  # the attention's input only: not the skip, not the MLP
                 ("pre", attn.o_proj, lambda m, args: got.__setitem__("z", args[0].detach()))]
        run(hf, prompt.tokens, *hooks)
        return got["z"][0].double()

    base = z1_with(torch.zeros(1))
    for i, (_, (head,)) in enumerate(units):
        cols = slice(head * d_head, (head + 1) * d_head)
        write = -(zs[0][0][:, cols] @ w_o[:, cols].T)[None]  # the head's write when zero-ablated, dz @ W_O
        exact = float(((z1_with(write) - base) * g1).sum())
        linear = float(((z1_with(EPS * write) - z1_with(-EPS * write)) / (2 * EPS) * g1).sum())
        got = float(part.corrections[i, 1, 0])
        assert got == pytest.approx(exact - linear, rel=2e-2, abs=2e-4), head
    assert part.corrections[:, 1, 0].abs().min() > 4e-3  # every term far from zero
