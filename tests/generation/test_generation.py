"""Generation loop, tracing, thinking steps and reliability on the tiny random model (fast)."""

import math

import pytest
import torch
from oracles import latent_by_hand

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model
from lensprobe.generation.loop import generate, trace_generation
from lensprobe.generation.thinking.schedule import parse_schedule


@pytest.fixture(scope="module")
def prompts(tiny):
    a = lp.build_prompt(tiny, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT)
    b = lp.build_prompt(tiny, "the cat sat on the mat", system="You answer.")
    return a, b


@pytest.fixture(scope="module")
def thinker():
    """A fresh tiny model (same weights as the fixture) with a <thinking> token added."""
    m = tiny_model(seed=0)
    tid = lp.generation.add_thinking_token(m, "<thinking>")
    return m, tid


@pytest.fixture(scope="module")
def thinker_hf(thinker, twin_of):
    """The thinker's weights (vocabulary grown by one) in a plain transformers model."""
    return twin_of(thinker[0])


def _no_hooks_left(model) -> bool:
    return all(not hp._forward_hooks for hp in model.hook_dict.values())


class Counter:
    """Counts forward passes (as an intervention at hook_embed)."""

    def __init__(self):
        self.calls = 0

    def hooks(self, model):
        def count(x, hook):
            self.calls += 1

        return [("hook_embed", count)]


# ----- what is recorded --------------------------------------------------------------------
def entropy_by_hand(logits: torch.Tensor) -> torch.Tensor:
    """-sum p ln p over the last dimension, in float64."""
    p = torch.softmax(logits.double(), -1)
    return -torch.where(p > 0, p * p.log(), 0.0).sum(-1)


def plain_forward(hf, tokens):
    """Logits [pos, vocab] and attention weights [layer][head, q, k] of one uncached forward of the plain model."""
    with torch.inference_mode():
        out = hf(torch.as_tensor(tokens).reshape(1, -1), output_attentions=True)
    return out.logits[0], [a[0] for a in out.attentions]


def test_step0_is_the_last_prompt_position(tiny, tiny_hf, prompts):
    p = prompts[0]
    trace = trace_generation(tiny, p, max_new_tokens=4, track={"system": "system"})
    logits, attentions = plain_forward(tiny_hf, p.tokens)
    assert abs(float(trace.entropy[0]) - float(entropy_by_hand(logits[-1]))) <= 1e-5
    assert trace.token_ids[0] == int(logits[-1].argmax())
    system = p.positions("system")
    for layer in range(tiny.cfg.n_layers):
        expect = attentions[layer][:, -1, system].sum(-1)  # [head]: the last query's row over the set
        assert torch.allclose(trace.attention["system"][0, layer], expect, atol=1e-5)


def test_cached_steps_equal_full_forward_of_the_whole_sequence(tiny, tiny_hf, prompts):
    """Each step's numbers equal one uncached forward of the plain model over prompt + generated tokens."""
    p = prompts[0]
    n = 12
    tid = int(tiny.tokenizer.encode(" the", add_special_tokens=False)[0])
    trace = trace_generation(tiny, p, max_new_tokens=n, stop_at_eos=False,
                             track={"q": "question", "gen": "generated", "tok": tid,
                                    "odd": lambda pos, t: pos % 2 == 1})
    seq = torch.cat([p.tokens[0], trace.token_ids])
    full, attentions = plain_forward(tiny_hf, seq[:-1])
    P = len(p)
    for t in range(n):
        q = P - 1 + t
        assert abs(float(trace.entropy[t]) - float(entropy_by_hand(full[q]))) <= 1e-5, t
        assert trace.token_ids[t] == int(full[q].argmax())
        assert torch.allclose(trace.chosen_prob[t], torch.softmax(full[q], -1)[trace.token_ids[t]], atol=1e-6)
        sets = {"q": p.positions("question"), "gen": list(range(P, q + 1)),
                "tok": [i for i in range(q + 1) if seq[i] == tid], "odd": list(range(1, q + 1, 2))}
        for layer in range(tiny.cfg.n_layers):
            row = attentions[layer][:, q, : q + 1]
            for name, pos in sets.items():
                expect = row[:, pos].sum(-1) if pos else torch.zeros(row.shape[0])
                assert torch.allclose(trace.attention[name][t, layer], expect, atol=1e-5), (name, t)


def test_trace_shapes_dataframe_and_mean(tiny, prompts):
    trace = trace_generation(tiny, prompts[0], max_new_tokens=6, stop_at_eos=False,
                             track={"system": "system", "question": "question"}, layers=[1])
    assert trace.entropy.shape == (6,)
    assert trace.attention["system"].shape == (6, 1, tiny.cfg.n_heads)
    assert trace.layers == [1]
    df = trace.to_dataframe()
    assert len(df) == 6 and list(df["step"]) == list(range(6))
    assert {"token", "token_id", "entropy", "chosen_prob", "thinking", "attention:system"} <= set(df.columns)
    assert df["attention:system"].tolist() == pytest.approx(trace.attention["system"].mean((1, 2)).tolist(), abs=1e-6)
    assert trace.mean()["question"].shape == (6,)
    assert trace.mean(over="head")["question"].shape == (6, 1)
    assert torch.allclose(trace.mean(over=("step", "layer", "head"))["system"], trace.attention["system"].mean())
    long = trace.attention_dataframe()
    assert len(long) == 2 * 6 * 1 * tiny.cfg.n_heads and set(long["layer"]) == {1}
    with pytest.raises(lp.LensprobeError, match="cannot average"):
        trace.mean(over="token")
    assert "".join(trace.str_tokens_rows[0]) == trace.text
    both = trace_generation(tiny, list(prompts), max_new_tokens=3, stop_at_eos=False, track={"s": "system"})
    one = both.row(1)
    assert one.n_rows == 1 and one.token_ids.tolist() == both.token_ids_rows[1].tolist()
    assert torch.equal(one.attention["s"], both.attention_rows["s"][1])


def test_attention_proportions_lie_in_unit_interval_and_complements_sum_to_one(tiny, prompts):
    trace = trace_generation(tiny, prompts[1], max_new_tokens=8, stop_at_eos=False,
                             track={"prompt": "prompt", "generated": "generated"})
    a, g = trace.attention["prompt"], trace.attention["generated"]
    assert (a >= 0).all() and (a <= 1 + 1e-6).all()
    assert torch.allclose(a + g, torch.ones_like(a), atol=1e-5)


# ----- batching and sampling ---------------------------------------------------------------
def test_batched_prompts_equal_one_by_one(tiny, prompts):
    a, b = prompts
    assert len(a) != len(b)
    track = {"question": "question", "system": "system"}
    both = trace_generation(tiny, [a, b], max_new_tokens=10, track=track, stop_at_eos=False)
    assert both.n_rows == 2 and both.entropy.shape == (2, 10)
    for i, p in enumerate((a, b)):
        alone = trace_generation(tiny, p, max_new_tokens=10, track=track, stop_at_eos=False)
        assert both.token_ids_rows[i].tolist() == alone.token_ids.tolist()
        assert both.texts[i] == alone.text
        assert torch.allclose(both.entropy_rows[i], alone.entropy, atol=1e-5)
        for name in track:
            assert torch.allclose(both.attention_rows[name][i], alone.attention[name], atol=1e-5)
    # token-id prompts work the same as Prompt objects (no segments needed)
    ids = generate(tiny, [a.tokens[0].tolist(), b.tokens[0].tolist()], max_new_tokens=10, stop_at_eos=False)
    assert ids.generated_ids == both.generated_ids


def test_sampling_is_seeded_and_per_prompt(tiny, prompts):
    a, b = prompts
    kw = dict(max_new_tokens=8, do_sample=True, temperature=1.3, top_p=0.95, stop_at_eos=False)
    s1 = generate(tiny, [a, b], seed=7, n_samples=3, **kw)
    s2 = generate(tiny, [a, b], seed=7, n_samples=3, **kw)
    assert s1.generated_ids == s2.generated_ids
    assert s1.prompt_index == [0, 0, 0, 1, 1, 1] and s1.sample_index == [0, 1, 2, 0, 1, 2]
    assert len({tuple(x) for x in s1.generated_ids[:3]}) == 3  # samples of one prompt differ
    alone = generate(tiny, b, seed=7, n_samples=3, **kw)
    assert alone.generated_ids == s1.generated_ids[3:]
    other = generate(tiny, [a, b], seed=8, n_samples=3, **kw)
    assert other.generated_ids != s1.generated_ids


def test_n_samples_band_summary(tiny, prompts):
    tr = trace_generation(tiny, prompts[0], max_new_tokens=5, do_sample=True, seed=1, n_samples=4,
                          track={"system": "system"}, stop_at_eos=False)
    df = lp.generation.trace_summary({"c": tr}, track="system", band="std")
    ent = df[df.metric == "entropy"].sort_values("step")
    assert ent["mean"].tolist() == pytest.approx(tr.entropy_rows.mean(0).tolist(), abs=1e-6)
    assert (ent["upper"] - ent["mean"]).tolist() == pytest.approx(tr.entropy_rows.std(0).tolist(), abs=1e-5)
    att = df[df.metric == "attention"].sort_values("step")
    assert att["mean"].tolist() == pytest.approx(tr.attention_rows["system"].mean((0, 2, 3)).tolist(), abs=1e-6)
    ci = lp.generation.trace_summary(tr, track=None, band="ci95")
    half = 1.96 * tr.entropy_rows.std(0) / 2.0
    assert (ci["upper"] - ci["mean"]).tolist() == pytest.approx(half.tolist(), abs=1e-5)
    smooth = lp.generation.trace_summary(tr, track=None, band="none", smooth=3)
    m = tr.entropy_rows.mean(0)
    assert smooth["mean"].iloc[1] == pytest.approx(float(m[:3].mean()), abs=1e-6)


def test_stop_at_eos_per_row(tiny, prompts):
    eos = tiny.tokenizer.eos_token_id

    class ForceEos:
        """Makes row 0 emit the end-of-sequence token at step 2."""

        def hooks(self, model):
            def boost(logits, hook):
                info = hook.step
                if info is not None and info.step == 2:
                    logits = logits.clone()
                    logits[0, -1, eos] += 1e4
                    return logits

            return [("hook_unembed", boost)]

    out = generate(tiny, list(prompts), max_new_tokens=6, interventions=[ForceEos()], track={"s": "system"})
    assert out.finish_reasons[0] == "eos" and out.lengths[0] == 3
    assert out.token_ids_rows[0, 2] == eos and (out.token_ids_rows[0, 3:] == -1).all()
    assert torch.isnan(out.entropy_rows[0, 3:]).all() and torch.isnan(out.attention_rows["s"][0, 3:]).all()
    assert not torch.isnan(out.entropy_rows[1]).any() and out.lengths[1] == 6
    assert out.texts[0] == tiny.tokenizer.decode(out.generated_ids[0][:-1])
    assert len(out.to_dataframe().query("row == 0")) == 3


# ----- interventions during generation ----------------------------------------------------
def test_interventions_see_new_positions_and_change_the_output(tiny, prompts):
    p = prompts[0]
    shapes, positions = [], []

    def zero_head(z, hook):
        shapes.append(tuple(z.shape))
        positions.append(hook.step.positions.tolist())
        z = z.clone()
        z[:, :, 1] = 0.0
        return z

    base = generate(tiny, p, max_new_tokens=5, stop_at_eos=False)
    ablated = generate(tiny, p, max_new_tokens=5, stop_at_eos=False, interventions=[("blocks.0.attn.hook_z", zero_head)])
    assert shapes[0][1] == len(p) and all(s[1] == 1 for s in shapes[1:]) and len(shapes) == 5
    assert positions[1] == [[len(p)]] and positions[4] == [[len(p) + 3]]
    assert not torch.allclose(base.entropy, ablated.entropy)
    assert _no_hooks_left(tiny)


# ----- thinking ----------------------------------------------------------------------------
def test_add_thinking_token():
    m = tiny_model(seed=2)
    V = m.cfg.d_vocab
    W = m.W_E.detach().clone()
    assert len(m.tokenizer.encode("<thinking>", add_special_tokens=False)) > 1
    tid = lp.generation.add_thinking_token(m, "<thinking>")
    assert tid == V and m.cfg.d_vocab == V + 1 and len(m.tokenizer) == V + 1
    assert torch.allclose(m.W_E[tid], W.mean(0)) and torch.equal(m.W_E[:V], W)
    assert m.tokenizer.encode("a <thinking> b", add_special_tokens=False).count(tid) == 1
    assert lp.generation.add_thinking_token(m, "<thinking>") == tid  # already there: unchanged
    assert m.cfg.d_vocab == V + 1
    logits = lp.forward(m, [1, 5, tid])
    assert logits.shape[-1] == V + 1
    with pytest.raises(lp.LensprobeError, match="already several tokens"):
        lp.generation.add_thinking_token(m, "<|im_start|><|im_end|>")
    with pytest.raises(lp.LensprobeError, match="whitespace"):
        lp.generation.add_thinking_token(m, "<think ing>")


def test_thinking_needs_the_token(tiny, prompts):
    with pytest.raises(lp.LensprobeError, match="add_thinking_token"):
        trace_generation(tiny, prompts[0], max_new_tokens=3, thinking=lp.generation.LatentFusion())
    with pytest.raises(lp.LensprobeError, match="think_when was given without thinking"):
        generate(tiny, prompts[0], max_new_tokens=3, think_when=lp.generation.schedule.every(2))
    with pytest.raises(lp.LensprobeError, match="alpha"):
        lp.generation.LatentFusion(alpha=1.5)
    with pytest.raises(lp.LensprobeError, match="top_p"):
        lp.generation.LatentFusion(top_p=0.0)


def test_pause_equals_forcing_the_thinking_token(thinker, thinker_hf, prompts):
    m, tid = thinker
    p = prompts[0]
    trace = trace_generation(m, p, max_new_tokens=8, thinking=lp.generation.Pause(), think_when=lp.generation.schedule.at([1, 4]),
                             stop_at_eos=False, track={"tok": "<thinking>"})
    assert trace.thinking.nonzero().flatten().tolist() == [1, 4]
    assert trace.token_ids[1] == tid and trace.token_ids[4] == tid
    assert trace.str_tokens_rows[0][1] == "<thinking>"
    # the same sequence as ordinary token ids, one uncached forward of the plain model
    seq = torch.cat([p.tokens[0], trace.token_ids])
    full, attentions = plain_forward(thinker_hf, seq[:-1])
    P = len(p)
    for t in range(8):
        assert abs(float(trace.entropy[t]) - float(entropy_by_hand(full[P - 1 + t]))) <= 1e-5, t
        thinking_keys = [P + i for i in (1, 4) if i < t]
        want = torch.stack([a[:, P - 1 + t, thinking_keys].sum(-1) for a in attentions])
        assert torch.allclose(trace.attention["thinking"][t], want, atol=1e-5), t
        if t not in (1, 4):
            assert trace.token_ids[t] == int(full[P - 1 + t].argmax())
    assert torch.allclose(trace.attention["thinking"], trace.attention["tok"])
    assert (trace.attention["thinking"][:2] == 0).all() and (trace.attention["thinking"][2:] > 0).all()


def test_latent_fusion_replaces_the_input_and_stays_in_the_cache(thinker, thinker_hf, prompts):
    m, tid = thinker
    p = prompts[0]
    fed = []

    def capture(x, hook):
        info = hook.step
        if info is not None and info.step == 3:  # the forward of the step-2 position
            fed.append(x[0, -1].clone())

    thinking = lp.generation.LatentFusion(alpha=0.6, top_p=0.9)
    trace = trace_generation(m, p, max_new_tokens=8, thinking=thinking, think_when=lp.generation.schedule.at([2]),
                             stop_at_eos=False, interventions=[("blocks.0.hook_resid_pre", capture)])
    # the vector fed at step 2, by hand from the plain model's final hidden state and logits there
    seq = torch.cat([p.tokens[0], trace.token_ids[:2]])
    E = thinker_hf.get_input_embeddings().weight
    with torch.inference_mode():
        out = thinker_hf(seq[None], output_hidden_states=True)
    expect, _ = latent_by_hand(out.hidden_states[-1][0, -1], out.logits[0, -1], E, alpha=0.6, top_p=0.9,
                               exclude=tid)
    assert torch.allclose(fed[0], expect, atol=1e-5)
    assert not torch.allclose(expect, E[tid])
    # later steps see the latent vector through the cache: an uncached forward of the plain model
    # with the same input embeddings gives the same entropies
    embeds = E[seq.tolist() + trace.token_ids[2:7].tolist()].clone()
    embeds[len(seq)] = expect
    with torch.inference_mode():
        full = thinker_hf(inputs_embeds=embeds[None]).logits[0]
    P = len(p)
    for t in range(3, 8):
        assert abs(float(trace.entropy[t]) - float(entropy_by_hand(full[P - 1 + t]))) <= 1e-4, t
    pause = trace_generation(m, p, max_new_tokens=8, thinking=lp.generation.Pause(), think_when=lp.generation.schedule.at([2]),
                             stop_at_eos=False)
    assert not torch.allclose(pause.entropy[3:], trace.entropy[3:])


def test_emitted_rule_and_thinking_set(thinker, prompts):
    m, tid = thinker

    class PreferThinking:
        """Makes the model choose <thinking> at steps 1 and 3."""

        def hooks(self, model):
            def boost(logits, hook):
                info = hook.step
                if info is not None and info.step in (1, 3):
                    logits = logits.clone()
                    logits[:, -1, tid] += 1e4
                    return logits

            return [("hook_unembed", boost)]

    tr = trace_generation(m, prompts[0], max_new_tokens=6, thinking=lp.generation.LatentFusion.coconut(),
                          interventions=[PreferThinking()], stop_at_eos=False)
    assert tr.thinking.nonzero().flatten().tolist() == [1, 3]
    assert tr.meta["thinking"]["alpha"] == 1.0 and "thinking" in tr.attention
    assert tr.chosen_prob[1] > 0.99


def test_schedule_rules(thinker, prompts):
    m, tid = thinker
    run = lambda rule, n=10: trace_generation(  # noqa: E731
        m, prompts[0], max_new_tokens=n, thinking=lp.generation.Pause(), think_when=rule, stop_at_eos=False
    ).thinking.nonzero().flatten().tolist()
    assert run(lp.generation.schedule.first(3)) == [0, 1, 2]
    assert run(lp.generation.schedule.every(4)) == [3, 7]
    assert run(lp.generation.schedule.every(4, offset=0, until=6)) == [0, 4]
    assert run(lp.generation.schedule.first(2) | lp.generation.schedule.at([5])) == [0, 1, 5]
    assert run(lp.generation.schedule.never()) == []
    base = trace_generation(m, prompts[0], max_new_tokens=10, stop_at_eos=False)
    thr = float(base.entropy[0]) - 1e-3  # only step 0 is sure to be above it
    got = run(lp.generation.schedule.entropy_above(thr))
    assert got[0] == 0
    tr = trace_generation(m, prompts[0], max_new_tokens=10, thinking=lp.generation.Pause(),
                          think_when=lp.generation.schedule.entropy_above(thr), stop_at_eos=False)
    assert all(tr.entropy[t] > thr for t in got) and all(tr.entropy[t] <= thr for t in range(10) if t not in got)
    with pytest.raises(lp.LensprobeError, match=r"schedule.every\(n\) needs an integer n >= 2, got 1"):
        lp.generation.schedule.every(1)
    with pytest.raises(lp.LensprobeError, match=r"schedule.first\(k\) needs an integer k >= 1, got 0"):
        lp.generation.schedule.first(0)


def test_parse_schedule():
    assert parse_schedule("every:8") == lp.generation.schedule.every(8)
    assert parse_schedule("emitted") == lp.generation.schedule.emitted()
    combo = parse_schedule("first:2 + at:5,9")
    assert isinstance(combo, lp.generation.schedule.AnyOf) and len(combo.rules) == 2
    with pytest.raises(lp.LensprobeError, match="cannot read schedule part 'sometimes'"):
        parse_schedule("sometimes")


# ----- files -------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".parquet", ".json"])
def test_save_and_load_round_trip(tiny, prompts, tmp_path, suffix):
    eos = tiny.tokenizer.eos_token_id

    class ForceEos:
        def hooks(self, model):
            def boost(logits, hook):
                info = hook.step
                if info is not None and info.step == 1:
                    logits = logits.clone()
                    logits[1, -1, eos] += 1e4
                    return logits

            return [("hook_unembed", boost)]

    tr = trace_generation(tiny, list(prompts), max_new_tokens=4, track={"s": "system", "q": "question"},
                          interventions=[ForceEos()])
    path = tr.save(tmp_path / f"trace{suffix}")
    back = lp.generation.load_trace(path)
    assert torch.equal(back.token_ids_rows, tr.token_ids_rows)
    assert torch.allclose(back.entropy_rows, tr.entropy_rows, equal_nan=True)
    assert torch.allclose(back.chosen_prob_rows, tr.chosen_prob_rows, equal_nan=True)
    for k in tr.attention_rows:
        assert torch.allclose(back.attention_rows[k], tr.attention_rows[k], equal_nan=True)
    assert back.texts == tr.texts and back.str_tokens_rows == tr.str_tokens_rows
    assert back.layers == tr.layers and back.finish_reasons == tr.finish_reasons == ["length", "eos"]
    assert back.meta == tr.meta
    assert back.to_dataframe().equals(tr.to_dataframe())
    with pytest.raises(lp.LensprobeError, match=".parquet or .json"):
        tr.save(tmp_path / "trace.pkl")


# ----- reliability -------------------------------------------------------------------------
def test_errors_before_generation_starts(tiny, prompts):
    p = prompts[0]
    c = Counter()
    with pytest.raises(lp.LensprobeError, match="unknown tracked set 'nope'"):
        trace_generation(tiny, p, max_new_tokens=4, track={"nope": "nope"}, interventions=[c])
    with pytest.raises(lp.LensprobeError, match="not a segment"):
        trace_generation(tiny, p.tokens[0].tolist(), max_new_tokens=4, track={"s": "system"}, interventions=[c])
    with pytest.raises(lp.LensprobeError, match="exceeds the model's context of 256"):
        generate(tiny, p, max_new_tokens=256 - len(p) + 1, interventions=[c])
    with pytest.raises(lp.LensprobeError, match="max_new_tokens"):
        generate(tiny, p, max_new_tokens=0)
    with pytest.raises(lp.LensprobeError, match="build_prompt"):
        generate(tiny, "What is 2+2?", max_new_tokens=2)
    with pytest.raises(lp.LensprobeError, match="top_p"):
        generate(tiny, p, max_new_tokens=2, do_sample=True, top_p=1.5)
    assert c.calls == 0
    # the longest allowed generation runs
    assert generate(tiny, p, max_new_tokens=256 - len(p), stop_at_eos=False).n_steps == 256 - len(p)


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_exception_mid_generation_leaves_no_hook_and_a_usable_model(tiny, prompts, exc):
    p = prompts[0]
    ref = trace_generation(tiny, p, max_new_tokens=6, track={"s": "system"}, stop_at_eos=False)

    def explode(x, hook):
        info = hook.step
        if info is not None and info.step == 3:
            raise exc("boom at step 3")

    user_point = tiny.hook_dict["blocks.1.hook_resid_post"]
    user_calls = []
    user_point.add_hook(lambda x, hook: user_calls.append(x.shape[1]))
    try:
        with pytest.raises(exc, match="boom at step 3"):
            trace_generation(tiny, p, max_new_tokens=6, track={"s": "system"},
                             interventions=[("blocks.0.hook_resid_post", explode)])
        # the user's hook ran at each forward before the failing one (prompt, steps 1 and 2);
        # the failing forward stopped in block 0, before the user's block-1 hook
        assert user_calls == [len(p), 1, 1]
        # only the user's own hook is still attached, and it still fires
        attached = {id(hp) for hp in tiny.hook_dict.values() if hp._forward_hooks}
        assert attached == {id(user_point)}
        lp.forward(tiny, p)
        assert user_calls == [len(p), 1, 1, len(p)]
    finally:
        user_point.remove_hooks()
    assert _no_hooks_left(tiny)
    again = trace_generation(tiny, p, max_new_tokens=6, track={"s": "system"}, stop_at_eos=False)
    assert again.token_ids.tolist() == ref.token_ids.tolist()
    assert torch.allclose(again.attention["s"], ref.attention["s"])
    assert not math.isnan(float(again.entropy[-1]))
    assert user_calls == [len(p), 1, 1, len(p)]  # removed: it no longer fires


def test_recording_off_keeps_no_attention(tiny, prompts):
    out = generate(tiny, prompts[0], max_new_tokens=3)
    assert out.attention_rows == {} and out.entropy.shape[0] == out.n_steps


def test_single_intervention_pair_is_accepted(tiny, prompts):
    calls = []
    generate(tiny, prompts[0], max_new_tokens=3, stop_at_eos=False,
             interventions=("blocks.0.hook_resid_pre", lambda x, hook: calls.append(x.shape[1])))
    assert calls == [len(prompts[0]), 1, 1]
