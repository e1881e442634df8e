"""KV-cached generation on a HookedTransformer (TransformerLens' own cache): tokens, entropies, attention,
left padding, ``hook.step``, ablations and latent thinking, against uncached forwards and loops of
the plain ``transformers`` twin."""

import copy

import pytest
import torch
from hooked_oracles import (
    entropy_by_hand,
    greedy_without_cache,
    hf_run,
    hf_with_thinking_token,
    set_heads,
    thinking_loop_by_hand,
)

import lensprobe as lp
from lensprobe.generation.recording import final_hidden_hook

pytestmark = pytest.mark.hooked

TOL = 1e-5
D_HEAD = 16


def ids_of(prompt) -> list[int]:
    return prompt.tokens[0].tolist()


def test_cached_greedy_tokens_equal_an_uncached_loop_of_the_plain_model(hooked, hooked_hf, hooked_prompts):
    a, b, _ = hooked_prompts
    out = lp.generate(hooked, [a, b], max_new_tokens=10, stop_at_eos=False)
    assert out.meta["engine"] == "hooked" and out.meta["attention"] == "eager"
    for r, p in enumerate((a, b)):  # the batch is left-padded: b is shorter than a
        tokens, ents = greedy_without_cache(hooked_hf, ids_of(p), 10)
        assert out.generated_ids[r] == tokens
        assert torch.allclose(out.entropy_rows[r].double(), torch.tensor(ents, dtype=torch.float64), atol=TOL)


def test_left_padded_batch_equals_its_rows_run_alone(hooked, hooked_prompts):
    a, b, f = hooked_prompts
    both = lp.trace_generation(hooked, [f, b, a], max_new_tokens=6, track={"question": "question"})
    for r, p in enumerate((f, b, a)):
        alone = lp.trace_generation(hooked, p, max_new_tokens=6, track={"question": "question"})
        assert both.generated_ids[r] == alone.generated_ids[0]
        assert torch.allclose(both.entropy_rows[r], alone.entropy_rows[0], atol=1e-6)
        assert torch.allclose(both.attention_rows["question"][r], alone.attention_rows["question"][0], atol=1e-6)
    assert len({len(p) for p in (f, b, a)}) == 3  # three lengths: two rows really are padded


def test_sampled_trace_equals_full_forward_logits_and_attention_at_every_step(hooked, hooked_hf, hooked_prompts):
    a, b, _ = hooked_prompts
    n = 8
    trace = lp.trace_generation(hooked, [a, b], max_new_tokens=n, do_sample=True, seed=3, n_samples=2,
                                stop_at_eos=False, track={"system": "system", "generated": "generated"})
    rows = [(p, j) for p in (a, b) for j in range(2)]
    assert trace.generated_ids[0] != trace.generated_ids[1]  # two samples of one prompt differ
    for r, (p, _) in enumerate(rows):
        seq = ids_of(p) + trace.generated_ids[r]
        with torch.inference_mode():
            full = hooked_hf(torch.tensor([seq[:-1]]), output_attentions=True)  # no cache, no padding
        P = len(p)
        for t in range(n):
            logits = full.logits[0, P - 1 + t]
            assert abs(float(trace.entropy_rows[r, t]) - entropy_by_hand(logits)) <= TOL, (r, t)
            chosen = float(torch.softmax(logits.double(), -1)[seq[P + t]])
            assert abs(float(trace.chosen_prob_rows[r, t]) - chosen) <= TOL, (r, t)
            for name, keys in (("system", p.positions("system")), ("generated", list(range(P, P + t)))):
                want = torch.stack([A[0, :, P - 1 + t, keys].sum(-1) for A in full.attentions])  # [layer, head]
                assert torch.allclose(trace.attention_rows[name][r, t], want, atol=TOL), (name, r, t)


def test_current_step_gives_each_rows_absolute_positions(hooked, hooked_prompts):
    a, b, _ = hooked_prompts
    seen = []

    def spy(x, hook):
        info = hook.step
        seen.append((info.step, info.positions.clone(), info.prompt_lengths.clone(), x.shape[1]))

    lp.generate(hooked, [a, b], max_new_tokens=3, interventions=[("blocks.0.hook_resid_pre", spy)], stop_at_eos=False)
    P, lengths = max(len(a), len(b)), torch.tensor([len(a), len(b)])
    assert [s[0] for s in seen] == [0, 1, 2] and [s[3] for s in seen] == [P, 1, 1]
    expected0 = torch.arange(P)[None] - (P - lengths)[:, None]  # padding is negative
    assert torch.equal(seen[0][1].cpu(), expected0)
    for step in (1, 2):
        assert torch.equal(seen[step][1].cpu(), (lengths + step - 1)[:, None])
    assert all(torch.equal(s[2].cpu(), lengths) for s in seen)


@pytest.mark.parametrize("positions", ["generated", "question", None])
def test_ablation_during_cached_generation_equals_an_uncached_ablated_forward(hooked, hooked_hf, hooked_prompts,
                                                                          positions):
    p = hooked_prompts[0]
    n = 6
    abl = lp.ablate_heads("L0H2", positions=positions, prompt=p if positions == "question" else None)
    trace = lp.generate(hooked, p, max_new_tokens=n, interventions=[abl], stop_at_eos=False)
    seq = ids_of(p) + trace.generated_ids[0]
    P = len(p)
    where = {"generated": range(P, len(seq) - 1), "question": p.positions("question"), None: None}[positions]
    logits = hf_run(hooked_hf, torch.tensor([seq[:-1]]), o_proj={0: set_heads([2], D_HEAD, positions=where)}).logits
    want = torch.tensor([entropy_by_hand(logits[0, P - 1 + t]) for t in range(n)], dtype=torch.float64)
    assert torch.allclose(trace.entropy_rows[0].double(), want, atol=TOL)
    assert trace.generated_ids[0] == [int(logits[0, P - 1 + t].argmax()) for t in range(n)]
    plain = lp.generate(hooked, p, max_new_tokens=n, stop_at_eos=False)
    assert (plain.entropy_rows - trace.entropy_rows).abs().max() > 1e-5  # the ablation changed something


@pytest.fixture(scope="module")
def thinker(hooked, hooked_hf):
    """A copy of the hooked model with <thinking> added, and the plain twin grown the same way by hand; both
    get the same final-norm weights other than 1, so the final hidden state differs from the normalised one."""
    model = copy.deepcopy(hooked)
    tid = lp.generation.add_thinking_token(model, "<thinking>")
    hf, hf_tid = hf_with_thinking_token(hooked_hf)
    assert hf_tid == tid
    weight = 1 + 0.5 * torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.ln_final.w.copy_(weight)
        hf.model.norm.weight.copy_(weight)
    return model, tid, hf


@pytest.mark.parametrize("mode", ["fusion", "pause"])
def test_latent_thinking_equals_a_hand_written_inputs_embeds_loop(thinker, hooked_prompts, mode):
    model, tid, hf = thinker
    p = hooked_prompts[0]
    think_steps, n = [1, 2, 5], 8
    thinking = lp.generation.LatentFusion(alpha=0.6, top_p=0.9) if mode == "fusion" else lp.generation.Pause()
    trace = lp.trace_generation(model, p, max_new_tokens=n, thinking=thinking,
                                think_when=lp.generation.schedule.at(think_steps), stop_at_eos=False)
    tokens, ents, attn = thinking_loop_by_hand(hf, ids_of(p), n, think_steps, tid, fusion=mode == "fusion")
    assert trace.meta["engine"] == "hooked"
    assert trace.token_ids.tolist() == tokens
    assert trace.thinking.nonzero().flatten().tolist() == think_steps
    assert torch.allclose(trace.entropy.double(), ents, atol=TOL)
    assert torch.allclose(trace.attention["thinking"], attn, atol=TOL)
    assert (trace.attention["thinking"][think_steps[0] + 1:] > 0).all()


def test_latent_fusion_refuses_a_hooked_transformer_whose_final_norm_weight_was_folded(hooked, hooked_hf):
    assert final_hidden_hook(hooked) == "unembed.hook_in"  # after the final norm's weight, as the plain model's
    folded = copy.deepcopy(hooked)
    folded.process_weights_(fold_ln=True, center_writing_weights=False, center_unembed=False)
    assert folded.cfg.normalization_type == "RMSPre"  # the weight now lives in W_U: no tensor holds h any more
    with pytest.raises(lp.LensprobeError, match=r"folded .*fold_ln=False"):
        final_hidden_hook(folded)


def test_compare_thinking_study_on_a_hooked_transformer(thinker, hooked_prompts):
    model, tid, hf = thinker
    p = hooked_prompts[0]
    traces = lp.studies.compare_thinking(lp.studies.with_thinking_token(model), [p], ["fusion", "none"], max_new_tokens=5,
                                 think_when=lp.generation.schedule.at([1]), stop_at_eos=False)
    fusion, none = traces.values()
    tokens, ents, _ = thinking_loop_by_hand(hf, ids_of(p), 5, [1], tid, fusion=True)
    assert fusion.token_ids.tolist() == tokens and torch.allclose(fusion.entropy.double(), ents, atol=TOL)
    plain, plain_ents = greedy_without_cache(hf, ids_of(p), 5)
    assert none.token_ids.tolist() == plain
    assert torch.allclose(none.entropy.double(), torch.tensor(plain_ents, dtype=torch.float64), atol=TOL)


def test_an_error_mid_generation_leaves_no_hook_on_the_hooked_transformer(hooked, hooked_prompts):
    p = hooked_prompts[0]

    def n_hooks() -> int:
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in hooked.modules())

    def fail_at_step_2(x, hook):
        if hook.step.step == 2:
            raise RuntimeError("stop here")

    before = n_hooks()
    with pytest.raises(RuntimeError, match="stop here"):
        lp.trace_generation(hooked, p, max_new_tokens=5, interventions=[("blocks.1.hook_resid_post", fail_at_step_2)])
    assert n_hooks() == before == 0
    again = lp.generate(hooked, p, max_new_tokens=3, stop_at_eos=False)
    assert again.generated_ids == [greedy_without_cache_ids(hooked, p, 3)]


def greedy_without_cache_ids(model, prompt, n: int) -> list[int]:
    ids = ids_of(prompt)
    for _ in range(n):
        with torch.inference_mode():
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


def test_a_hooked_transformer_built_from_a_config_generates_from_token_ids():
    """``HookedTransformer(cfg)`` (no tokenizer, TransformerLens' way to build a toy model): generation and
    traces run from token ids, greedy tokens equal an uncached argmax loop of the model itself, continuous
    batching equals each prompt alone, EOS only where the call names one, thinking needs a tokenizer."""
    import transformer_lens as tl

    cfg = tl.HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=64, d_head=8, n_heads=4, d_vocab=50,
                                     act_fn="gelu", attn_only=False, seed=0, device="cpu")
    model = tl.HookedTransformer(cfg)
    assert model.tokenizer is None
    ids = [[3, 9, 4, 7, 1], [5, 5], [8, 2, 6]]
    out = lp.generate(model, ids, max_new_tokens=5, batch_size=2)
    assert out.texts == ["", "", ""] and out.finish_reasons == ["length"] * 3
    for r, p in enumerate(ids):
        seq = list(p)
        with torch.inference_mode():
            for _ in range(5):
                seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
        assert out.generated_ids[r] == seq[len(p):], r
        assert lp.generate(model, [p], max_new_tokens=5).generated_ids[0] == out.generated_ids[r]
    stop = out.generated_ids[0][1]
    named = lp.generate(model, ids[:1], max_new_tokens=5, eos_token_id=stop)
    assert named.generated_ids[0] == out.generated_ids[0][:2] and named.finish_reasons == ["eos"]
    trace = lp.trace_generation(model, ids[0], max_new_tokens=3)
    assert trace.generated_ids[0] == out.generated_ids[0][:3] and trace.attention["prompt"].shape[0] == 3
    with pytest.raises(lp.LensprobeError, match="thinking tokens need a tokenizer"):
        lp.generate(model, ids[0], max_new_tokens=3, thinking=lp.generation.Pause())
