"""Head ablation (GQA included), head means, patching, sweeps and ARM on a HookedTransformer: against its
own weights by hand and against the plain ``transformers`` twin with the same edit made there."""

import pytest
import torch
from hooked_oracles import entropy_by_hand, hf_run, o_proj_inputs, set_heads

import lensprobe as lp
from lensprobe.core.hooks.attach import ActivationRecorder, intervene
from lensprobe.interventions.arm import arm_redistribute

pytestmark = pytest.mark.hooked

TOL = 1e-5
D_HEAD = 16


def test_zeroing_a_head_equals_removing_its_share_of_the_output_projection(hooked, hooked_prompts):
    tokens = hooked_prompts[0].tokens
    names = ["blocks.1.attn.hook_z", "blocks.1.hook_attn_out"]
    clean, ablated = ActivationRecorder(names), ActivationRecorder(["blocks.1.hook_attn_out"])
    with torch.inference_mode():
        with intervene(hooked, clean):
            hooked(tokens)
        with intervene(hooked, lp.ablate_heads("L1H2"), ablated):
            hooked(tokens)
    z = clean.acts["blocks.1.attn.hook_z"][0]                       # [pos, head, d_head]
    W_O = hooked.blocks[1].attn.W_O.detach()                         # [head, d_head, d_model]
    # attn_out = sum_h z_h W_O[h] + b_O: without head 2 it loses exactly z_2 W_O[2]
    by_hand = clean.acts["blocks.1.hook_attn_out"][0] - z[:, 2] @ W_O[2]
    torch.testing.assert_close(ablated.acts["blocks.1.hook_attn_out"][0], by_hand, atol=1e-5, rtol=0)
    assert (z[:, 2] @ W_O[2]).abs().max() > 1e-3  # the head did contribute


@pytest.mark.parametrize("spec", ["L0H1", ["L1H0", "L1H3"], "H2"])
def test_zero_ablation_logits_equal_the_plain_model_with_the_slice_zeroed(hooked, hooked_hf, hooked_prompts, spec):
    tokens = hooked_prompts[0].tokens
    heads = lp.ablate_heads(spec).resolve(hooked)
    edits = {}
    for layer in {lay for lay, _ in heads}:
        edits[layer] = set_heads([h for lay, h in heads if lay == layer], D_HEAD)
    want = hf_run(hooked_hf, tokens, o_proj=edits).logits
    got = lp.forward(hooked, tokens, lp.ablate_heads(spec))
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    assert (got - lp.forward(hooked, tokens)).abs().max() > 1e-4


def test_kv_group_ablation_equals_zeroing_that_kv_heads_values(hooked, hooked_hf, hooked_prompts):
    tokens = hooked_prompts[1].tokens

    def zero_kv1(v):  # [batch, pos, n_kv * d_head]: KV head 1 feeds query heads 2 and 3
        v[..., D_HEAD:2 * D_HEAD] = 0
        return v

    want = hf_run(hooked_hf, tokens, v_proj={0: zero_kv1}).logits
    torch.testing.assert_close(lp.forward(hooked, tokens, lp.interventions.ablate_kv_group("L0KV1")), want, atol=TOL, rtol=0)
    torch.testing.assert_close(lp.forward(hooked, tokens, lp.ablate_heads(["L0H2", "L0H3"])), want, atol=TOL, rtol=0)


def test_mean_ablation_and_head_means_on_a_hooked_transformer(hooked, hooked_hf, hooked_prompts):
    a, b, f = hooked_prompts
    means = lp.interventions.head_means(hooked, [a, b], layers=[0])
    xs = [o_proj_inputs(hooked_hf, p.tokens, 0)[0] for p in (a, b)]  # [pos, head, d_head] each
    by_hand = torch.cat(xs).double().mean(0)                          # over every position of both prompts
    torch.testing.assert_close(means.values[0].double(), by_hand, atol=1e-6, rtol=0)
    want = hf_run(hooked_hf, f.tokens, o_proj={0: set_heads([3], D_HEAD, by_hand[[3]].float())}).logits
    got = lp.forward(hooked, f, lp.ablate_heads("L0H3", method="mean", reference=[a, b]))
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


def test_ablation_at_a_segment_only(hooked, hooked_hf, hooked_prompts):
    p = hooked_prompts[2]
    question = p.positions("question")
    want = hf_run(hooked_hf, p.tokens, o_proj={0: set_heads([1], D_HEAD, positions=question)}).logits
    got = lp.forward(hooked, p, lp.ablate_heads("L0H1", positions="question", prompt=p))
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    assert torch.allclose(got[0, : min(question)], lp.forward(hooked, p)[0, : min(question)], atol=1e-6)


def logit_norm(logits, prompt=None):
    """A metric that moves with any change of the last position's logits (entropy barely moves on a random
    model, whose next-token distribution is nearly uniform)."""
    return logits[:, -1].double().norm(dim=-1)


def test_patching_copies_the_sources_segment_into_the_target(hooked, hooked_hf, hooked_prompts):
    a, _, f = hooked_prompts  # the same question, with and without filler
    res = lp.patch(hooked, f, a, ["blocks.0.attn.hook_z", "blocks.1.hook_resid_post"], segments=["question"],
                   metric=logit_norm)
    table = res.to_dataframe().set_index("site")
    src = o_proj_inputs(hooked_hf, f.tokens, 0)[0]
    qa, qf = a.positions("question"), f.positions("question")

    def copy_question(x):  # [batch, pos, n_heads * d_head]
        x[:, qa] = src[qf].reshape(len(qf), -1)
        return x

    clean = float(logit_norm(hf_run(hooked_hf, a.tokens).logits))
    patched = float(logit_norm(hf_run(hooked_hf, a.tokens, o_proj={0: copy_question}).logits))
    source = float(logit_norm(hf_run(hooked_hf, f.tokens).logits))
    row = table.loc["blocks.0.attn.hook_z @ question"]
    assert abs(row["clean"] - clean) <= TOL and abs(row["patched"] - patched) <= TOL
    assert abs(res.source_value - source) <= TOL and abs(patched - clean) > 1e-4
    # after the last block nothing mixes positions: the question's residual cannot reach the last position
    assert max(qa) < len(a) - 1 and abs(table.loc["blocks.1.hook_resid_post @ question"]["patched"] - clean) <= TOL


@pytest.mark.parametrize("batch_size", [32, 3])
def test_sweep_equals_one_plain_forward_per_head(hooked, hooked_hf, hooked_prompts, batch_size):
    p = hooked_prompts[0]
    res = lp.ablation_sweep(hooked, p, "entropy", batch_size=batch_size, progress=False)
    base = entropy_by_hand(hf_run(hooked_hf, p.tokens).logits[0, -1])
    assert abs(float(res.baseline[0]) - base) <= TOL
    grid = res.grid()
    for layer in range(2):
        for head in range(4):
            ablated = hf_run(hooked_hf, p.tokens, o_proj={layer: set_heads([head], D_HEAD)}).logits[0, -1]
            assert abs(float(grid[layer, head]) - (entropy_by_hand(ablated) - base)) <= TOL, (layer, head)
    assert grid.abs().max() > 1e-4


def arm_mlp_out_by_hand(model, tokens, rule, seed):
    """Layer 0's MLP output under ARM, by hand on the model's own weights: ``act_fn(gate)`` and ``up`` read
    from an unedited run, ARM's rule applied with a generator seeded ``seed``, then ``post @ W_out + b_out``.

    (The plain model's ``act_fn(gate)`` differs from these by float rounding, and ARM, which orders the
    entries by size, turns a swap of two nearly equal entries into a different draw: so the gated
    activations are taken from the model itself.)"""
    rec = ActivationRecorder(["blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_pre_linear"])
    with torch.inference_mode(), intervene(model, rec):
        model(tokens)
    a = torch.nn.functional.silu(rec.acts["blocks.0.mlp.hook_pre"])
    post = arm_redistribute(a, generator=torch.Generator().manual_seed(seed), **rule)
    post = post * rec.acts["blocks.0.mlp.hook_pre_linear"]
    mlp = model.blocks[0].mlp
    return post @ mlp.W_out.detach() + mlp.b_out.detach()


def with_mlp_out(hf, layer, value):
    """A forward hook on the plain model's MLP ``layer`` that returns ``value`` (removed by the caller)."""
    return hf.model.layers[layer].mlp.register_forward_hook(lambda _m, _a, _out: value)


def test_arm_edits_the_gated_mlp_of_a_hooked_transformer(hooked, hooked_hf, hooked_prompts):
    p = hooked_prompts[0]
    rule = {"c": 0.5, "percentile": 90}
    by_hand = arm_mlp_out_by_hand(hooked, p.tokens, rule, seed=7)
    rec = ActivationRecorder(["blocks.0.hook_mlp_out"])
    with torch.inference_mode(), intervene(hooked, lp.ARM(layer=0, seed=7, **rule), rec):
        got = hooked(p.tokens)
    torch.testing.assert_close(rec.acts["blocks.0.hook_mlp_out"], by_hand, atol=1e-6, rtol=0)
    handle = with_mlp_out(hooked_hf, 0, by_hand)  # the rest of the network, on the plain model
    try:
        torch.testing.assert_close(got, hf_run(hooked_hf, p.tokens).logits, atol=TOL, rtol=0)
    finally:
        handle.remove()
    assert (got - lp.forward(hooked, p)).abs().max() > 1e-4


def test_sweep_under_arm_per_row(hooked, hooked_hf, hooked_prompts):
    p = hooked_prompts[0]
    rule = {"c": 0.5, "percentile": 90}
    arm = lp.ARM(seed=1, per_row=True, **rule)
    res = lp.ablation_sweep(hooked, p, logit_norm, heads=["L1H0", "L1H1"], interventions=[arm], progress=False)
    # every row holds the same prompt and draws from its own generator seeded 1: the same ARM edit
    handle = with_mlp_out(hooked_hf, 0, arm_mlp_out_by_hand(hooked, p.tokens, rule, seed=1))
    try:
        assert abs(float(res.baseline[0]) - float(logit_norm(hf_run(hooked_hf, p.tokens).logits))) <= TOL
        for i, head in enumerate([0, 1]):
            want = logit_norm(hf_run(hooked_hf, p.tokens, o_proj={1: set_heads([head], D_HEAD)}).logits)
            assert abs(float(res.ablated[0, i]) - float(want)) <= TOL, head
    finally:
        handle.remove()
    assert res.changes.abs().min() > 1e-3
    with pytest.raises(lp.LensprobeError, match="per_row=True, the default"):
        lp.ablation_sweep(hooked, p, "entropy", heads="L1H0", interventions=[lp.ARM(**rule, per_row=False)],
                          progress=False)
