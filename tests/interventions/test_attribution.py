"""Attribution patching (AtP, AtP*): checked against torch.autograd on the plain transformers twin,
against exact ablation where the estimate must be exact, and for leaving no hooks or grad state."""

import pytest
import torch
from oracles import hf_head_gradients, hook_snapshot
from transformer_lens.model_bridge import TransformerBridge

import lensprobe as lp
from lensprobe.core.errors import LensprobeError
from lensprobe.core.measures.forced import ContinuationEntropy, ContinuationLogProb, LogitDiff
from lensprobe.core.measures.measure import measure_once
from lensprobe.experiments.attribution import attribute_heads
from lensprobe.experiments.sweep import ablation_sweep


@pytest.fixture(scope="module")
def prompts(tiny):
    a = lp.build_prompt(tiny, "What is 12+7?", system="Please reason step by step.",
                        filler=lp.Filler.meaningless(count=5))
    b = lp.build_prompt(tiny, "the cat sat on the mat", system="You answer.")
    return [a, b]


def attention_only(n_layers: int, *, n_kv_heads: int | None = None, scale: float = 3.0):
    """A random attention-only model without norms (TransformerLens native): its logits are linear in
    the last layer's head outputs; weights scaled up so that the softmax saturates."""
    cfg = dict(n_layers=n_layers, d_model=32, d_head=8, n_heads=4, n_ctx=64, d_vocab=50, attn_only=True,
               normalization_type=None, act_fn="relu", seed=0, positional_embedding_type="standard")
    if n_kv_heads is not None:
        cfg["n_key_value_heads"] = n_kv_heads
    model = TransformerBridge.boot_native(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model


TOKENS = torch.tensor([[1, 5, 7, 3, 9, 11, 2, 4, 8, 6]])


def by_hand_entropy(logits):
    logp = torch.log_softmax(logits[-1].double(), -1)
    return -(logp.exp() * logp).sum()


def test_atp_equals_autograd_on_the_plain_twin(tiny, tiny_hf, prompts):
    p = prompts[0]
    att = attribute_heads(tiny, p, "entropy")
    zs, grads, _ = hf_head_gradients(tiny_hf, p.tokens, by_hand_entropy)
    d = tiny.cfg.d_head
    want = torch.stack([torch.stack([(-zs[layer][0, :, h * d:(h + 1) * d] * grads[layer][0, :, h * d:(h + 1) * d]).sum()
                                     for h in range(tiny.cfg.n_heads)]) for layer in range(tiny.cfg.n_layers)])
    got = att.grid().double()
    assert torch.linalg.norm(got - want) <= 1e-4 * torch.linalg.norm(want)
    assert att.values[0] == pytest.approx(float(by_hand_entropy(tiny_hf(p.tokens).logits[0].detach())), rel=1e-5)


def test_resample_at_positions_equals_autograd(tiny, tiny_hf, prompts):
    """Resampled from another prompt at three positions: dz is (reference - clean) there, 0 elsewhere."""
    p, ref = prompts[0], prompts[1]
    positions = [2, 3, 5]
    att = attribute_heads(tiny, p, "logit_diff", tokens=(7, 11), ablation="resample", reference=ref,
                          positions=positions)
    zs, grads, zref = hf_head_gradients(tiny_hf, p.tokens, lambda lg: lg[-1, 7] - lg[-1, 11], reference=ref.tokens)
    d = tiny.cfg.d_head
    want = torch.zeros(tiny.cfg.n_layers, tiny.cfg.n_heads, dtype=torch.float64)
    for layer in range(tiny.cfg.n_layers):
        for h in range(tiny.cfg.n_heads):
            cols = slice(h * d, (h + 1) * d)
            dz = zref[layer][0, positions, cols] - zs[layer][0, positions, cols]
            want[layer, h] = (dz * grads[layer][0, positions, cols]).sum()
    assert torch.linalg.norm(att.grid().double() - want) <= 1e-4 * torch.linalg.norm(want)


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_atp_is_exact_when_the_metric_is_linear_in_the_heads(ablation):
    model = attention_only(1)
    reference = [TOKENS[:, :6], TOKENS[:, 3:]] if ablation == "mean" else None
    fn = lambda logits, prompt: logits[:, -1, 3] - logits[:, -1, 7]  # noqa: E731
    exact = ablation_sweep(model, TOKENS, fn, method=ablation, reference=reference, progress=False)
    att = attribute_heads(model, TOKENS, "logit_diff", tokens=(3, 7), ablation=ablation, reference=reference)
    torch.testing.assert_close(att.grid(), exact.grid(), rtol=1e-4, atol=1e-4 * exact.grid().abs().max().item())


def test_qk_fix_is_exact_for_a_layer0_head_of_a_two_layer_attention_model():
    model = attention_only(2)
    fn = lambda logits, prompt: logits[:, -1, 3] - logits[:, -1, 7]  # noqa: E731
    exact = ablation_sweep(model, TOKENS, fn, progress=False).grid()
    atp = attribute_heads(model, TOKENS, fn).grid()
    star = attribute_heads(model, TOKENS, fn, method="atp*").grid()
    scale = exact.abs().max().item()
    torch.testing.assert_close(star, exact, rtol=1e-4, atol=1e-5 * scale)
    assert (atp[0] - exact[0]).abs().max() > 0.1 * scale  # plain AtP misses layer 1's saturated softmax
    torch.testing.assert_close(atp[1], exact[1], rtol=1e-4, atol=1e-5 * scale)  # layer 1 feeds the logits linearly


def test_graddrop_score_by_hand():
    """Two layers: a layer-0 head's score is |its direct effect| (dropping layer 1 leaves only the skip
    path; dropping its own layer gives 0; sum / (2 - 1)); a layer-1 head's is |its estimate|."""
    model = attention_only(2)
    att = attribute_heads(model, TOKENS, "logit_diff", tokens=(3, 7), method="atp*")
    rec = lp.core.hooks.attach.ActivationRecorder(["blocks.0.attn.hook_z"])
    lp.forward(model, TOKENS, rec)
    z = rec.acts["blocks.0.attn.hook_z"][0, -1]  # [head, d_head] at the last position
    readout = model.W_U[:, 3] - model.W_U[:, 7]
    direct = torch.einsum("hd,hdm,m->h", -z, model.blocks[0].attn.W_O, readout).detach()
    scores = att.table.set_index("head_label")["score"]
    for h in range(4):
        assert scores[f"L0H{h}"] == pytest.approx(abs(float(direct[h])), rel=1e-4)
        assert scores[f"L1H{h}"] == pytest.approx(abs(float(att.grid()[1, h])), rel=1e-6)


def frozen_effect(model, fn, layer: int, head: int, frozen: int | None) -> float:
    """Exact change of ``fn`` when head ``(layer, head)`` is zeroed at ``hook_z`` while layer ``frozen``'s
    heads keep their clean outputs (so nothing reaches the metric through that layer's change)."""
    clean: dict = {}

    def keep(z, hook):
        clean["z"] = z.clone()

    def zero(z, hook):
        z = z.clone()
        z[:, :, head] = 0
        return z

    hold = [] if frozen is None else [(f"blocks.{frozen}.attn.hook_z", lambda z, hook: clean["z"])]
    with torch.no_grad():
        with model.hooks(fwd_hooks=[(f"blocks.{frozen or 0}.attn.hook_z", keep)]):
            base = fn(model(TOKENS), None)
        with model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero), *hold]):
            return float(fn(model(TOKENS), None) - base)


def test_graddrop_applies_to_the_qk_fixed_estimate():
    """Three attention-only layers, a linear metric. With layer D's gradient dropped, a head's term is its
    exact effect with layer D's output held at its clean value: the QK fix is exact through the one
    attention layer left (below D with D's gradient dropped, above D with the full gradient). So the
    score of a layer-0 head is (|effect, layer 1 held| + |effect, layer 2 held|) / 2, and of a layer-1
    head (|effect| + |effect, layer 2 held|) / 2."""
    model = attention_only(3)
    fn = lambda logits, prompt: logits[:, -1, 3] - logits[:, -1, 7]  # noqa: E731
    star = attribute_heads(model, TOKENS, fn, method="atp*")
    scores = star.table.set_index("head_label")["score"]
    for h in range(4):
        want0 = (abs(frozen_effect(model, fn, 0, h, 1)) + abs(frozen_effect(model, fn, 0, h, 2))) / 2
        want1 = (abs(frozen_effect(model, fn, 1, h, None)) + abs(frozen_effect(model, fn, 1, h, 2))) / 2
        assert scores[f"L0H{h}"] == pytest.approx(want0, rel=1e-4, abs=1e-6 * want0 + 1e-7)
        assert scores[f"L1H{h}"] == pytest.approx(want1, rel=1e-4, abs=1e-7)


def test_gqa_groups(tiny, prompts):
    """A KV group's AtP is the sum of its query heads' (the estimate is linear in dz); under GQA each
    query head keeps its own estimate, and the QK fix is exact for a layer-0 group of a two-layer
    attention-only GQA model."""
    heads = attribute_heads(tiny, prompts[0], "entropy")
    groups = attribute_heads(tiny, prompts[0], "entropy", unit="kv")
    assert list(groups.table.columns[:3]) == ["layer", "kv_head", "head_label"]
    assert groups.labels == ["L0KV0", "L0KV1", "L1KV0", "L1KV1"]
    torch.testing.assert_close(groups.grid(), heads.grid().reshape(2, 2, 2).sum(-1))
    model = attention_only(2, n_kv_heads=2)
    fn = lambda logits, prompt: logits[:, -1, 3] - logits[:, -1, 7]  # noqa: E731
    star = attribute_heads(model, TOKENS, fn, method="atp*", unit="kv")
    for g in range(2):
        exact = measure_once(model, lp.core.measures.measure.CallableMeasure(fn), TOKENS, lp.interventions.ablate_kv_group((0, g)))
        base = measure_once(model, lp.core.measures.measure.CallableMeasure(fn), TOKENS)
        assert float(star.grid()[0, g]) == pytest.approx(float(exact - base), rel=1e-4, abs=1e-5)


def test_results_do_not_depend_on_batch_size_or_prompt_grouping(tiny, prompts):
    one = [attribute_heads(tiny, p, "entropy", method="atp*", batch_size=32) for p in prompts]
    for size in (1, 3):
        both = attribute_heads(tiny, prompts, "entropy", method="atp*", batch_size=size)
        torch.testing.assert_close(both.estimates, torch.cat([o.estimates for o in one]), rtol=1e-5, atol=1e-8)
        torch.testing.assert_close(both.scores, torch.cat([o.scores for o in one]), rtol=1e-5, atol=1e-8)
    assert both.table["spread"].gt(0).all()


def test_no_hooks_and_no_grad_state_left_behind(tiny, prompts):
    before = hook_snapshot(tiny)
    flags = [p.requires_grad for p in tiny.parameters()]
    grad_on = torch.is_grad_enabled()
    with torch.no_grad():
        attribute_heads(tiny, prompts, "entropy", method="atp*")
        assert not torch.is_grad_enabled()
    with pytest.raises(LensprobeError, match="not finite"):
        attribute_heads(tiny, prompts[0], lambda logits, prompt: logits[:, -1, 0] * float("nan"), method="atp*")
    assert hook_snapshot(tiny) == before
    assert [p.requires_grad for p in tiny.parameters()] == flags
    assert all(p.grad is None for p in tiny.parameters())
    assert torch.is_grad_enabled() == grad_on


def test_forced_metrics_by_hand(tiny, tiny_hf, prompts):
    p = prompts[0]
    cont = (5, 9, 13, 2)
    tokens = torch.cat([p.tokens, torch.tensor([cont])], 1)
    logits = tiny_hf(tokens).logits[0].detach().double()
    n = p.tokens.shape[1]
    logp = torch.log_softmax(logits, -1)
    want_lp = sum(float(logp[n - 1 + i, t]) for i, t in enumerate(cont))
    want_ent = sum(float(-(logp[n - 1 + i].exp() * logp[n - 1 + i]).sum()) for i in range(len(cont))) / len(cont)
    assert float(measure_once(tiny, ContinuationLogProb(cont), p)[0]) == pytest.approx(want_lp, rel=1e-5)
    assert float(measure_once(tiny, ContinuationEntropy(cont), p)[0]) == pytest.approx(want_ent, rel=1e-5)
    last = tiny_hf(p.tokens).logits[0, -1].detach()
    assert float(measure_once(tiny, LogitDiff(7, 11), p)[0]) == pytest.approx(float(last[7] - last[11]), rel=1e-5)
    # teacher forced: the continuation's entropy, attributed, equals autograd through prompt + continuation
    att = attribute_heads(tiny, p, "entropy", continuation=cont)
    zs, grads, _ = hf_head_gradients(
        tiny_hf, tokens, lambda lg: -(torch.log_softmax(lg[n - 1:-1], -1).exp() * torch.log_softmax(lg[n - 1:-1], -1))
        .sum(-1).mean())
    want = torch.stack([(-zs[layer][0] * grads[layer][0]).reshape(len(tokens[0]), 4, -1).sum((0, 2))
                        for layer in range(2)])
    assert torch.linalg.norm(att.grid() - want) <= 1e-4 * torch.linalg.norm(want)


@pytest.mark.unchecked
def test_bad_input_says_what_to_do(tiny, prompts):
    with pytest.raises(LensprobeError, match="'atp' or 'atp\\*'"):
        attribute_heads(tiny, prompts[0], method="exact")
    with pytest.raises(LensprobeError, match="tokens=\\(a, b\\)"):
        attribute_heads(tiny, prompts[0], "logit_diff")
    with pytest.raises(LensprobeError, match="no gradient"):
        attribute_heads(tiny, prompts[0], "attention:question")
    with pytest.raises(LensprobeError, match="one corrupted prompt per prompt"):
        attribute_heads(tiny, prompts, ablation=[prompts[1]])
    with pytest.raises(LensprobeError, match="unit must be"):
        attribute_heads(tiny, prompts[0], unit="layer")


def test_corrupted_prompts_resample_each_prompt_from_its_own(tiny, prompts):
    a, b = prompts
    first = list(range(10))  # both prompts are longer
    pair = attribute_heads(tiny, [a, b], "entropy", ablation=[b, a], positions=first)
    for i, (p, ref) in enumerate([(a, b), (b, a)]):
        alone = attribute_heads(tiny, p, "entropy", ablation="resample", reference=ref, positions=first)
        torch.testing.assert_close(pair.estimates[i], alone.estimates[0])
    assert not torch.equal(pair.estimates[0], pair.estimates[1])


def test_atp_on_the_embedded_model_equals_autograd(smol, smol_hf):
    """SmolLM2 (30 layers, 9 query heads over 3 KV heads): AtP of the entropy equals autograd on the plain
    transformers model to 1e-4 relative, reading the last position's logits only (as "entropy" does) and
    all positions' logits (a callable metric); AtP* leaves the last layer's heads at AtP (no later
    attention to fix)."""
    p = lp.build_prompt(smol, "What is 12+7?", system=None)
    n, d = smol.cfg.n_heads, smol.cfg.d_head

    def by_hand(keep: int):
        zs, grads, _ = hf_head_gradients(smol_hf, p.tokens, by_hand_entropy, logits_to_keep=keep)
        return torch.stack([(-zs[layer][0] * grads[layer][0]).reshape(-1, n, d).sum((0, 2))
                            for layer in range(smol.cfg.n_layers)]).double()

    # Each side takes the unembedding's product with the same number of rows. Its backward sums 49,152
    # terms per coordinate that cancel (an entropy's gradient sums to zero over the vocabulary); in
    # float32, the CPU kernel (MKL) for a product with one row (here also 2-3, and with two threads more
    # small counts) accumulates them 1e-4 relative off the float64 value, the kernel for all 38 rows
    # 1e-6. The last-row estimate against full-logit autograd: 1.9e-4. Like with like: 1.1e-5 (the
    # oracle's entropy in float64, lensprobe's in float32) and 1.3e-7 (both in float64).
    att = attribute_heads(smol, p, "entropy")  # logits_to_keep=1
    want = by_hand(1)
    assert torch.linalg.norm(att.grid().double() - want) <= 1e-4 * torch.linalg.norm(want)
    full = attribute_heads(smol, p, lambda logits, prompt: by_hand_entropy(logits[0])[None])  # every position
    want = by_hand(0)
    assert torch.linalg.norm(full.grid().double() - want) <= 1e-4 * torch.linalg.norm(want)
    star = attribute_heads(smol, p, "entropy", method="atp*", heads="L29H0,L29H4,L0H0")
    torch.testing.assert_close(star.grid()[29, [0, 4]], att.grid()[29, [0, 4]])
    assert float(star.grid()[0, 0]) != pytest.approx(float(att.grid()[0, 0]), rel=1e-6)


def test_the_residual_stream_path_of_the_qk_fix_gives_the_same_numbers(tiny, prompts, monkeypatch):
    """Models without a hook at the attention input (HookedTransformer) add the QK fix's rows to the
    whole residual stream and go back to one row after the layer: the same numbers."""
    want = attribute_heads(tiny, prompts[0], "entropy", method="atp*")
    monkeypatch.setattr("lensprobe.experiments.atp_qkfix._input_hook",
                        lambda model, layer: (f"blocks.{layer}.hook_resid_pre", True))
    got = attribute_heads(tiny, prompts[0], "entropy", method="atp*", batch_size=3)
    torch.testing.assert_close(got.estimates, want.estimates, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(got.scores, want.scores, rtol=1e-5, atol=1e-9)
