"""``lens=``: the logit lens per row, step and layer, against plain ``transformers`` on the final sequence
(``output_hidden_states=True`` at position ``prompt length - 1 + step``, the twin's own final norm and
``lm_head`` applied by hand), for an RMSNorm model (the tiny Llama), a LayerNorm model (a tiny GPT-NeoX) and a
soft-capped one (a tiny Gemma 2); the last layer against the model's own logits; batched and refilled rows
against each row alone; an ablation applied to the twin by hand; translators; the files."""

import copy

import pytest
import torch
from lens_oracles import assert_lens_matches, hand_stats, twin_lens

import lensprobe as lp
from lensprobe.core.models.loading import quiet

TOL = 1e-5


@pytest.mark.parametrize(("engine", "batch_steps"), [("bridge", 8), ("hf", 8), ("hf", 1), ("hf", 4)])
def test_every_layers_lens_per_step_equals_the_plain_model_rmsnorm(tiny, tiny_hf, engine, batch_steps, monkeypatch):
    """``batch_steps``: the steps whose unembedding product waits for one (1: every step alone; 4: one product in
    the middle of the 6 steps, one at the end; 8: one at the end)."""
    monkeypatch.setattr(lp.generation.lens, "BATCH_STEPS", batch_steps)
    prompts = [[5, 17, 3, 99, 42, 7, 8], [11, 12, 13]]  # left padding in one static batch
    out = lp.generate(tiny, prompts, max_new_tokens=6, stop_at_eos=False, engine=engine, lens="logit", lens_top_k=4)
    assert out.meta["engine"] == engine and out.meta["lens"] == {"lens": "logit", "layers": [0, 1], "top_k": 4}
    assert out.lens.entropy_rows.shape == (2, 6, 2) and out.lens.top_ids_rows.shape == (2, 6, 2, 4)
    for r, ids in enumerate(prompts):
        lens, logits = twin_lens(tiny_hf, tiny_hf.model.norm, tiny_hf.lm_head, ids + out.generated_ids[r])
        assert_lens_matches(out, r, lens, logits, len(ids))


@pytest.fixture(scope="module")
def neox():
    """A tiny random GPT-NeoX (LayerNorm, parallel residual) as a bridge, and its plain twin."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from lensprobe.core.models.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    config = GPTNeoXConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                           intermediate_size=128, max_position_embeddings=256, initializer_range=0.2,
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config._attn_implementation = "eager"
    with torch.random.fork_rng():
        torch.manual_seed(1)
        hf = GPTNeoXForCausalLM(config).eval()
    twin = copy.deepcopy(hf)
    with quiet():
        model = TransformerBridge.boot_transformers("lensprobe-tiny-neox", hf_model=hf, tokenizer=tok, n_ctx=256)
    return model, twin


def test_every_layers_lens_per_step_equals_the_plain_model_layernorm(neox):
    model, twin = neox
    prompts = [[5, 17, 3, 99, 42], [11, 12, 13, 14]]
    out = lp.generate(model, prompts, max_new_tokens=5, stop_at_eos=False, lens="logit")
    assert isinstance(twin.gpt_neox.final_layer_norm, torch.nn.LayerNorm)
    for r, ids in enumerate(prompts):
        lens, logits = twin_lens(twin, twin.gpt_neox.final_layer_norm, twin.lm_head, ids + out.generated_ids[r])
        assert_lens_matches(out, r, lens, logits, len(ids), tol=2e-5)
    assert (out.lens.chosen_rank[:, :, -1] == 0).all()  # greedy: the last layer ranks the chosen token first
    assert (out.lens.chosen_rank[:, :, 0] > 0).any()  # and the first layer does not always


def test_a_soft_capped_models_last_layer_is_its_own_distribution():
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from lensprobe.core.models.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    config = Gemma2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                          final_logit_softcapping=2.0, initializer_range=0.3, bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config._attn_implementation = "eager"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        hf = Gemma2ForCausalLM(config).eval()
    twin = copy.deepcopy(hf)
    with quiet():
        model = TransformerBridge.boot_transformers("lensprobe-tiny-gemma2", hf_model=hf, tokenizer=tok, n_ctx=256)
    ids = [5, 17, 3, 99]
    out = lp.generate(model, ids, max_new_tokens=4, stop_at_eos=False, lens="logit")
    lens, logits = twin_lens(twin, twin.model.norm, twin.lm_head, ids + out.generated_ids[0], cap=2.0)
    assert float(logits.abs().max()) <= 2.0  # the twin's own logits are capped
    assert_lens_matches(out, 0, lens, logits, len(ids))
    assert torch.allclose(out.lens.entropy[:, -1], out.entropy, atol=TOL)


def test_the_last_layer_is_the_models_own_distribution(tiny):
    out = lp.generate(tiny, [[5, 17, 3, 99, 42], [11, 12, 13]], max_new_tokens=6, stop_at_eos=False, lens="logit",
                      do_sample=True, seed=0)
    ran = out.recorded_rows
    last = out.lens
    assert torch.allclose(last.entropy_rows[..., -1][ran], out.entropy_rows[ran], atol=TOL)
    assert torch.allclose(last.chosen_prob_rows[..., -1][ran], out.chosen_prob_rows[ran], atol=TOL)
    assert (last.kl_rows[..., -1][ran].abs() < 1e-6).all()
    assert (last.kl_rows[..., 0][ran] > 1e-4).all()  # an earlier layer is another distribution


@pytest.mark.parametrize("batch_size", [1, 2])
def test_refilled_and_sampled_rows_equal_each_row_alone(tiny, batch_size):
    prompts = [[5, 17, 3, 99, 42], [11, 12, 13], [7, 8, 9, 10, 11, 12, 13]]
    kw = dict(stop_at_eos=False, do_sample=True, seed=3, n_samples=2, lens="logit", lens_top_k=3)
    out = lp.generate(tiny, prompts, max_new_tokens=5, batch_size=batch_size, caps=[3, 5, 4], **kw)
    assert out.meta["batching"] == "continuous batching"
    for r in range(out.n_rows):
        pi, j = out.prompt_index[r], out.sample_index[r]
        alone = lp.generate(tiny, [prompts[pi]], max_new_tokens=[3, 5, 4][pi], **kw)
        assert out.generated_ids[r] == alone.generated_ids[j]
        n = len(out.generated_ids[r])
        for f in ("entropy_rows", "top_probs_rows", "chosen_prob_rows", "kl_rows"):
            got, want = getattr(out.lens, f), getattr(alone.lens, f)
            assert torch.allclose(got[r, :n], want[j, :n], atol=TOL), (r, f)
            assert torch.isnan(got[r, n:]).all()
        for f in ("top_ids_rows", "chosen_rank_rows"):
            assert torch.equal(getattr(out.lens, f)[r, :n], getattr(alone.lens, f)[j, :n]), (r, f)


def test_under_an_ablation_the_lens_is_that_of_the_ablated_plain_model(tiny, twin_of):
    twin = twin_of(tiny)
    d_head, head = tiny.cfg.d_head, 1

    def zero_head(_m, args):
        x = args[0].clone()
        x[..., head * d_head:(head + 1) * d_head] = 0
        return (x,)

    ids = [5, 17, 3, 99, 42]
    out = lp.generate(tiny, ids, max_new_tokens=5, stop_at_eos=False, interventions=[lp.ablate_heads(f"L0H{head}")],
                      lens="logit")
    handle = twin.model.layers[0].self_attn.o_proj.register_forward_pre_hook(zero_head)
    try:
        lens, logits = twin_lens(twin, twin.model.norm, twin.lm_head, ids + out.generated_ids[0])
    finally:
        handle.remove()
    assert_lens_matches(out, 0, lens, logits, len(ids))
    plain = lp.generate(tiny, ids, max_new_tokens=5, stop_at_eos=False, lens="logit")
    assert not torch.allclose(plain.lens.entropy[:, 0], out.lens.entropy[:, 0], atol=1e-4)


def by_hand_from(resid: torch.Tensor, twin, translator=None) -> torch.Tensor:
    """``[step, layer, vocab]`` lens logits of recorded residual streams ``{layer: [step, d_model]}``."""
    with torch.no_grad():
        return torch.stack([twin.lm_head(twin.model.norm(resid[i] if translator is None else translator(i, resid[i])))
                            for i in range(resid.shape[0])], 1)


def test_latent_thinking_and_arm_the_lens_of_the_recorded_residual_stream(twin_of):
    from lensprobe.core.models.testing import tiny_model

    model = tiny_model(seed=0)
    lp.generation.add_thinking_token(model)
    ids = lp.build_prompt(model, "What is 12+7?", system="You answer.").tokens[0].tolist()
    out = lp.generate(model, ids, max_new_tokens=6, stop_at_eos=False, lens="logit",
                      thinking=lp.generation.LatentFusion(alpha=0.6, top_p=0.9),
                      think_when=lp.generation.schedule.every(2), interventions=[lp.ARM(c=0.1, percentile=95, seed=0)],
                      record="blocks.*.hook_resid_post")
    assert out.thinking.any()
    twin = twin_of(model)
    resid = torch.stack([out.activations[f"blocks.{i}.hook_resid_post"] for i in range(2)])  # [layer, step, d]
    logits = by_hand_from(resid, twin)  # [step, layer, vocab]
    for t in range(6):
        chosen = int(out.token_ids[t])
        for i in range(2):
            want = hand_stats(logits[t, i], logits[t, -1], chosen, 5)
            assert abs(float(out.lens.entropy[t, i]) - float(want["entropy"])) < TOL, (t, i)
            assert abs(float(out.lens.kl[t, i]) - float(want["kl"])) < TOL, (t, i)
            assert int(out.lens.chosen_rank[t, i]) == int(want["chosen_rank"]), (t, i)
    assert torch.allclose(out.lens.entropy[:, -1], out.entropy, atol=TOL)


def test_a_translator_goes_before_the_final_norm(tiny, tiny_hf):
    ids = [5, 17, 3, 99, 42]
    d = tiny.cfg.d_model
    gen = torch.Generator().manual_seed(0)
    weights = torch.eye(d).repeat(2, 1, 1) + 0.3 * torch.randn(2, d, d, generator=gen)
    biases = torch.randn(2, d, generator=gen)
    tuned = lp.generation.AffineLens(weights, biases)
    out = lp.generate(tiny, ids, max_new_tokens=4, stop_at_eos=False, lens=tuned, record="blocks.*.hook_resid_post")
    resid = torch.stack([out.activations[f"blocks.{i}.hook_resid_post"] for i in range(2)])
    logits = by_hand_from(resid, tiny_hf, translator=lambda i, h: h @ weights[i] + biases[i])
    model_logits = by_hand_from(resid, tiny_hf)[:, -1]
    for t in range(4):
        for i in range(2):
            want = hand_stats(logits[t, i], model_logits[t], int(out.token_ids[t]), 5)
            assert abs(float(out.lens.entropy[t, i]) - float(want["entropy"])) < 1e-4, (t, i)
            assert out.lens.top_ids[t, i].tolist() == want["top_ids"].tolist(), (t, i)
    identity = lp.generate(tiny, ids, max_new_tokens=4, stop_at_eos=False, lens=lp.generation.AffineLens())
    logit = lp.generate(tiny, ids, max_new_tokens=4, stop_at_eos=False, lens="logit")
    assert torch.allclose(identity.lens.entropy, logit.lens.entropy, atol=1e-6)
    assert identity.meta["lens"]["lens"].startswith("AffineLens(")
    assert not torch.allclose(out.lens.entropy, logit.lens.entropy, atol=1e-3)


def test_rows_stopped_early_are_marked_and_the_lens_survives_the_files(tiny, tmp_path):
    out = lp.generate(tiny, [[5, 17, 3, 99], [11, 12, 13, 14, 15]], max_new_tokens=4, stop_at_eos=False, caps=[2, 4],
                      lens="logit", lens_layers=[1], lens_top_k=2)
    assert out.lens.layers == [1] and out.lens.recorded_rows.tolist() == [[True, True, False, False], [True] * 4]
    assert out.lens.entropy_rows.shape == (2, 4, 1)
    one = out.row(0)
    assert one.lens.entropy.shape == (2, 1) and torch.equal(one.lens.top_ids, out.lens.top_ids_rows[0, :2])
    df = out.lens.to_dataframe()
    assert len(df) == 6 and list(df["layer"].unique()) == [1]
    assert df["top_token"].tolist() == [out.lens.token_text[i] for i in df["top_token_id"]]
    assert all(isinstance(out.lens.token_text[i], str) for i in out.lens.top_ids_rows[out.lens.top_ids_rows >= 0].tolist())
    for suffix in ("parquet", "json"):
        back = lp.generation.load_trace(out.save(tmp_path / f"t.{suffix}"))
        for f in ("entropy_rows", "top_ids_rows", "top_probs_rows", "chosen_rank_rows", "chosen_prob_rows", "kl_rows"):
            a, b = getattr(back.lens, f), getattr(out.lens, f)
            assert a.dtype == b.dtype and torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()), f
        assert back.lens.layers == [1] and back.lens.token_text == out.lens.token_text and back.lens.lens == "logit"
    plain = lp.generation.load_trace(lp.generate(tiny, [1, 2, 3], max_new_tokens=2).save(tmp_path / "p.json"))
    assert plain.lens is None


def test_a_trace_set_passes_the_lens_on_and_its_folder_is_identified_by_it(tiny, tmp_path):
    prompts = [[5, 17, 3, 99], [11, 12, 13]]
    kw = dict(max_new_tokens=3, stop_at_eos=False, out=tmp_path / "set")
    traces = lp.generation.trace_prompts(tiny, prompts, lens="logit", lens_top_k=2, **kw)
    alone = lp.generate(tiny, prompts[1], max_new_tokens=3, stop_at_eos=False, lens="logit", lens_top_k=2)
    assert torch.allclose(traces[1].lens.entropy, alone.lens.entropy, atol=TOL)
    with pytest.raises(lp.LensprobeError, match="another 'trace set' run:\n  lens_top_k"):
        lp.generation.trace_prompts(tiny, prompts, lens="logit", lens_top_k=3, **kw)


@pytest.mark.unchecked  # values outside the annotations, as a user without a type checker passes them
def test_bad_lens_settings_are_refused_before_any_forward(tiny):
    calls = []
    spy = ("blocks.0.hook_resid_pre", lambda x, hook: calls.append(1))
    d = tiny.cfg.d_model
    cases = {
        "lens must be 'logit'": [dict(lens="tuned"), dict(lens=3)],
        "lens_top_k must be a whole number": [dict(lens_top_k=0), dict(lens_top_k=10**9), dict(lens_top_k=True),
                                             dict(lens_top_k=2.0)],
        "layer 5 out of range": [dict(lens_layers=[5])],
        r"must return \[batch, d_model\]": [dict(lens=lambda layer, x: x[:, :3])],
        "the translator failed on layer 0": [dict(lens=lambda layer, x: x @ torch.zeros(3, 3))],
        "do not fit this model": [dict(lens=lp.generation.AffineLens(torch.zeros(3, d, d)))],
    }
    for message, settings in cases.items():
        for s in settings:
            s = {"lens": "logit", **s}
            with pytest.raises(lp.LensprobeError, match=message):
                lp.generate(tiny, [1, 2, 3], max_new_tokens=2, interventions=[spy], **s)
    assert calls == []
    for bad, message in (((torch.zeros(2, 3, 4),), "square"), ((torch.zeros(2, 4, 4), torch.zeros(3, 4)), "do not fit"),
                         (("w",), "finite float tensor"), ((torch.full((1, 2, 2), float("nan")),), "finite")):
        with pytest.raises(lp.LensprobeError, match=message):
            lp.generation.AffineLens(*bad)


@pytest.mark.slow
def test_the_embedded_models_lens_per_step(smol, smol_hf):
    p = lp.build_prompt(smol, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT)
    out = lp.generate(smol, p, max_new_tokens=5, stop_at_eos=False, lens="logit", lens_layers=[0, 14, 28, 29])
    assert out.meta["engine"] == "hf" and out.lens.entropy.shape == (5, 4)
    ids = p.tokens[0].tolist()
    lens, logits = twin_lens(smol_hf, smol_hf.model.norm, smol_hf.lm_head, ids + out.generated_ids[0])
    for t in range(5):
        pos = len(ids) - 1 + t
        for i, layer in enumerate([0, 14, 28, 29]):
            want = hand_stats(lens[layer, pos], logits[pos], int(out.token_ids[t]), 5)
            assert abs(float(out.lens.entropy[t, i]) - float(want["entropy"])) < 1e-3, (t, layer)
            assert abs(float(out.lens.kl[t, i]) - float(want["kl"])) < 1e-3, (t, layer)
            assert int(out.lens.chosen_rank[t, i]) == int(want["chosen_rank"]), (t, layer)
    assert torch.allclose(out.lens.entropy[:, -1], out.entropy, atol=1e-4)
    assert (out.lens.chosen_rank[:, -1] == 0).all() and (out.lens.kl[:, -1] < 1e-4).all()
