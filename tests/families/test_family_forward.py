"""Each paper family against plain transformers on one forward pass: logits, every layer's attention
pattern (Gemma's sliding window included), head ablation and ARM with the family's preset."""

import pytest
import torch
from interventions.test_arm import numpy_arm
from interventions.test_arm_gemma_quantile import authors_gemma_rule

import lensprobe as lp

TOL = 1e-5
TEXT = "What is 12+7? The answer is 19. the cat sat on the mat / / / / he he"


@pytest.fixture(scope="module")
def tokens(fam):
    ids = fam.tokenizer(TEXT, return_tensors="pt").input_ids
    assert ids.shape[1] > 2 * (window(fam) or 0)  # Gemma's sliding window binds
    return ids


def window(fam) -> int | None:
    return getattr(fam.plain.config.get_text_config(), "sliding_window", None)


def plain_logits(fam, tokens, **kw):
    with torch.inference_mode():
        return fam.plain(tokens, **kw)


def test_logits_and_every_attention_pattern_equal_transformers(fam, tokens):
    ref = plain_logits(fam, tokens, output_attentions=True)
    torch.testing.assert_close(lp.forward(fam.model, tokens), ref.logits, atol=TOL, rtol=0)
    pats = lp.attention_patterns(fam.model, tokens)
    assert list(pats) == list(range(len(ref.attentions)))
    for layer, pattern in pats.items():
        torch.testing.assert_close(pattern, ref.attentions[layer][0], atol=TOL, rtol=0)
    if fam.family.name.startswith("gemma"):  # layer 0 slides: keys more than `window` back get nothing
        n, w = tokens.shape[1], window(fam)
        outside = torch.tensor([[j <= i - w for j in range(n)] for i in range(n)])
        assert (pats[0][:, outside] == 0).all() and (pats[1][:, outside] > 0).all()


@pytest.mark.parametrize("heads", [[(0, 1)], [(1, 0), (1, 3)]])
def test_head_ablation_equals_zeroing_the_heads_input_to_o_proj(fam, tokens, heads):
    """The head's slice of o_proj's input set to zero by hand on the plain model (Qwen2's v bias and
    Gemma's norms included: the slice is the head's whole output)."""
    d = fam.model.cfg.d_head
    handles = []
    for layer in {layer for layer, _ in heads}:
        cols = [c for lay, h in heads if lay == layer for c in range(h * d, (h + 1) * d)]

        def zero(_module, args, cols=cols):
            z = args[0].clone()
            z[..., cols] = 0
            return (z,)
        handles.append(fam.layers()[layer].self_attn.o_proj.register_forward_pre_hook(zero))
    try:
        want = plain_logits(fam, tokens).logits
    finally:
        for h in handles:
            h.remove()
    got = lp.forward(fam.model, tokens, lp.ablate_heads(heads))
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    assert (got - lp.forward(fam.model, tokens)).abs().max() > 1e-4  # the ablation changed the logits


def rule_by_hand(arm, act: torch.Tensor, seed: int) -> torch.Tensor:
    """The rule written apart from lensprobe's: the authors' Gemma function (draws from torch's generator
    seeded with ``seed``), or the numpy rule with ``seed``'s draws for the entries it moves."""
    if arm.variant == "gemma":
        torch.manual_seed(seed)
        return authors_gemma_rule(act, arm.c, arm.percentile)
    rule = dict(c=arm.c, percentile=arm.percentile, p_min=arm.p_min, p_max=arm.p_max, k=arm.k)
    _, moved = numpy_arm(act.numpy(), torch.zeros(act.numel()).double().numpy(), **rule)
    u = torch.rand(len(moved), generator=torch.Generator().manual_seed(seed)).double().numpy()
    return torch.from_numpy(numpy_arm(act.numpy(), u, **rule)[0]).float()


def test_arm_with_the_family_preset_equals_the_rule_applied_in_the_plain_mlp(fam, tokens):
    """The paper model's preset (Gemma: the fraction-and-quantile variant) on layer 0's MLP: the plain
    model's MLP computed by hand, ``down_proj(rule(act_fn(gate_proj(x))) * up_proj(x))``, with the same draws."""
    arm = lp.ARM.preset(fam.family.paper_model, "math500", seed=5)
    assert arm.variant == ("gemma" if fam.family.name.startswith("gemma") else "default")
    mlp = fam.layers()[0].mlp

    def by_hand(_module, args, _out):
        x = args[0]
        act = rule_by_hand(arm, mlp.act_fn(mlp.gate_proj(x)), seed=5)
        return mlp.down_proj(act * mlp.up_proj(x))
    handle = mlp.register_forward_hook(by_hand)
    try:
        want = plain_logits(fam, tokens).logits
    finally:
        handle.remove()
    got = lp.forward(fam.model, tokens, arm)
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    assert (got - lp.forward(fam.model, tokens)).abs().max() > 1e-4  # ARM moved activations that matter
