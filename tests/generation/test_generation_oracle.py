"""Generation traces computed a second way: greedy ``transformers`` ``generate`` (with scores and
attentions) on a separately built plain model with the same weights, and arithmetic written out here.

The tiny-model oracles are fast; the SmolLM2 ones take the ``smol`` fixture and are slow.
"""

import copy

import pytest
import torch
from oracles import latent_by_hand

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model
from lensprobe.generation.thinking.latent import latent_fusion_vector

TOL = 1e-5
SMOL_ENTROPY_TOL = 1e-4  # entropy and chosen-token probability: float32 softmax over 49,152 tokens


def entropy_by_hand(logits: torch.Tensor) -> float:
    """-sum p ln p of the softmax of one row of logits, in float64."""
    p = torch.softmax(logits.double(), -1)
    p = p[p > 0]
    return float(-(p * p.log()).sum())


def left_padded(prompts, pad_id: int):
    """The prompts as one left-padded batch: (ids [row, P], attention mask, offset of each row's first token)."""
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), P), dtype=torch.long)
    offsets = []
    for r, p in enumerate(prompts):
        ids[r, P - len(p):] = p.tokens[0]
        mask[r, P - len(p):] = 1
        offsets.append(P - len(p))
    return ids, mask, offsets


def reference_generate(hf, prompts, max_new_tokens: int):
    """Greedy ``generate`` of the plain model on the left-padded prompts, scores and attentions kept.

    Returns the output, the padded prompt length, each row's padding offset and each row's
    generated tokens (up to and including the first end-of-sequence token).
    """
    pad = hf.generation_config.pad_token_id
    ids, mask, offsets = left_padded(prompts, pad)
    with torch.inference_mode():
        ref = hf.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                          output_scores=True, output_attentions=True, return_dict_in_generate=True,
                          pad_token_id=pad)
    eos = hf.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or ())
    P = ids.shape[1]
    generated = []
    for r in range(len(prompts)):
        row = ref.sequences[r, P:].tolist()
        end = next((i + 1 for i, tok in enumerate(row) if tok in eos), len(row))
        generated.append(row[:end])
    return ref, P, offsets, generated


def expected_attention(ref, P: int, row: int, step: int, positions: list[int]) -> torch.Tensor:
    """[layer, head]: the newest query's attention at ``step`` summed over the key ``positions``
    (padded coordinates), from transformers' attention weights."""
    K = P + step  # keys visible to the step's query
    per_layer = []
    for layer_attn in ref.attentions[step]:
        weights = layer_attn[row, :, -1, :K]  # [head, key]
        per_layer.append(weights[:, positions].sum(-1) if positions else torch.zeros(weights.shape[0]))
    return torch.stack(per_layer)


def check_trace(trace, ref, P, offsets, generated, set_positions, entropy_tol=TOL):
    """Tokens, entropy, chosen-token probability and every tracked set's attention, row by row and step
    by step, against the reference. ``set_positions(name, row, step, sequence)`` lists the set's padded
    key positions visible at that step."""
    assert trace.generated_ids == generated
    for r, tokens in enumerate(generated):
        seq = ref.sequences[r].tolist()
        for t, token in enumerate(tokens):
            scores = ref.scores[t][r]
            assert abs(float(trace.entropy_rows[r, t]) - entropy_by_hand(scores)) <= entropy_tol, (r, t)
            p_chosen = float(torch.softmax(scores.double(), -1)[token])
            assert abs(float(trace.chosen_prob_rows[r, t]) - p_chosen) <= entropy_tol, (r, t)
            for name in trace.attention_rows:
                want = expected_attention(ref, P, r, t, set_positions(name, r, t, seq))
                got = trace.attention_rows[name][r, t]
                assert torch.allclose(got, want, atol=TOL), (name, r, t, got, want)
                # the per-step summary is the mean over layers and heads
                assert abs(float(trace.mean()[name].reshape(trace.n_rows, -1)[r, t]) - float(want.mean())) <= TOL


# ----- tiny model (fast) ---------------------------------------------------------------------
def tiny_prompts(model):
    return [lp.build_prompt(model, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT),
            lp.build_prompt(model, "the cat sat on the mat", system="You answer.")]


@pytest.mark.parametrize("batch", ["one prompt", "left-padded pair"])
@pytest.mark.parametrize("engine", ["bridge", "hf"])
def test_trace_equals_transformers_generate_on_the_tiny_model(tiny, tiny_hf, engine, batch):
    prompts = tiny_prompts(tiny)[: 1 if batch == "one prompt" else 2]
    n = 8
    ref, P, offsets, generated = reference_generate(tiny_hf, prompts, n)
    assert len(generated[0]) >= 4
    if batch != "one prompt":
        assert len(prompts[0]) != len(prompts[1]) and max(offsets) > 0  # one row really is padded
    grow = max(set(generated[0]), key=generated[0].count)  # a set that grows as tokens are generated

    def set_positions(name, r, t, seq):
        real = range(offsets[r], P + t)  # the row's own positions, padding left out
        if name == "system":
            return [offsets[r] + i for i in prompts[r].positions("system")]
        if name == "generated":
            return list(range(P, P + t))
        if name == "grow":
            return [j for j in real if seq[j] == grow]
        return [j for j in real if (j - offsets[r]) % 3 == 0]  # "every third": unpadded position % 3 == 0

    track = {"system": "system", "generated": "generated", "grow": grow,
             "every third": lambda pos, token: pos % 3 == 0}
    trace = lp.trace_generation(tiny, prompts, max_new_tokens=n, track=track, engine=engine)
    assert trace.meta["engine"] == engine
    check_trace(trace, ref, P, offsets, generated, set_positions)
    assert (trace.attention_rows["generated"][0, 1:] > 0).all()  # the generated set was attended to


def test_plain_generate_equals_transformers_on_the_tiny_model(tiny, tiny_hf):
    """``lp.generate`` (no recording, fused attention): the same tokens and entropies."""
    prompts = tiny_prompts(tiny)
    ref, P, offsets, generated = reference_generate(tiny_hf, prompts, 10)
    out = lp.generate(tiny, prompts, max_new_tokens=10)
    assert out.generated_ids == generated and out.attention_rows == {}
    for r, tokens in enumerate(generated):
        want = torch.tensor([entropy_by_hand(ref.scores[t][r]) for t in range(len(tokens))], dtype=torch.float64)
        assert torch.allclose(out.entropy_rows[r, : len(tokens)].double(), want, atol=TOL)


@pytest.fixture(scope="module")
def tiny_thinker(twin_of):
    """A tiny model with <thinking> added, and its plain twin (built after the token was added)."""
    model = tiny_model(seed=0)
    tid = lp.generation.add_thinking_token(model, "<thinking>")
    return model, tid, twin_of(model)


def hand_written_thinking_loop(hf, prompt, n, think_steps, tid, *, fusion, alpha=0.6, top_p=0.9):
    """Greedy decoding with the plain model's KV cache, feeding the thinking input by hand:
    returns tokens, entropies and the attention onto thinking positions [step, layer, head]."""
    E = hf.get_input_embeddings().weight
    P = prompt.tokens.shape[1]
    tokens, ents, attn, widths = [], [], [], []
    with torch.inference_mode():
        out = hf(prompt.tokens, use_cache=True, output_hidden_states=True, output_attentions=True)
        for t in range(n):
            logits, h = out.logits[0, -1], out.hidden_states[-1][0, -1]
            ents.append(entropy_by_hand(logits))
            thinking_pos = [P + i for i in range(t) if i in think_steps]
            attn.append(torch.stack([a[0, :, -1, thinking_pos].sum(-1) for a in out.attentions]))
            tok = int(logits.argmax())
            if t in think_steps:
                tok = tid
                if fusion:
                    emb, width = latent_by_hand(h, logits, E, alpha=alpha, top_p=top_p, exclude=tid)
                    widths.append(width)
                else:
                    emb = E[tid]
            else:
                emb = E[tok]
            tokens.append(tok)
            out = hf(inputs_embeds=emb[None, None], past_key_values=out.past_key_values, use_cache=True,
                     output_hidden_states=True, output_attentions=True)
    return tokens, torch.tensor(ents, dtype=torch.float64), torch.stack(attn), widths


@pytest.mark.parametrize(("mode", "engine"), [("fusion", "bridge"), ("fusion", "hf"), ("pause", "hf")])
def test_latent_thinking_trace_equals_a_hand_written_loop_on_the_tiny_model(tiny_thinker, mode, engine):
    model, tid, hf = tiny_thinker
    prompt = tiny_prompts(model)[0]
    think_steps, n = [1, 2, 5], 8
    thinking = lp.generation.LatentFusion(alpha=0.6, top_p=0.9) if mode == "fusion" else lp.generation.Pause()
    trace = lp.trace_generation(model, prompt, max_new_tokens=n, thinking=thinking, engine=engine,
                                think_when=lp.generation.schedule.at(think_steps), stop_at_eos=False)
    tokens, ents, attn, widths = hand_written_thinking_loop(hf, prompt, n, think_steps, tid,
                                                            fusion=mode == "fusion")
    assert trace.meta["engine"] == engine
    assert trace.token_ids.tolist() == tokens
    assert trace.thinking.nonzero().flatten().tolist() == think_steps
    assert torch.allclose(trace.entropy.double(), ents, atol=TOL)
    assert torch.allclose(trace.attention["thinking"], attn, atol=TOL)
    assert (trace.attention["thinking"][think_steps[0] + 1:] > 0).all()
    if mode == "fusion":
        assert max(widths) > 1  # the nucleus held several tokens: the weighted sum was exercised


# ----- SmolLM2 (slow) ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def prompt(smol):
    return lp.build_prompt(smol, "What is 12+7? Answer briefly.", system=lp.MATH_SYSTEM_PROMPT)


@pytest.mark.parametrize("engine", ["bridge", "hf"])
def test_entropy_and_attention_match_transformers_generate(smol, smol_hf, prompt, engine):
    n = 16
    ref, P, offsets, generated = reference_generate(smol_hf, [prompt], n)
    assert len(generated[0]) >= 8
    grow = max(set(generated[0]), key=generated[0].count)

    def set_positions(name, r, t, seq):
        if name == "system":
            return prompt.positions("system")
        if name == "generated":
            return list(range(P, P + t))
        return [i for i in range(P + t) if seq[i] == grow]

    trace = lp.trace_generation(smol, prompt, max_new_tokens=n, engine=engine,
                                track={"system": "system", "grow": grow, "generated": "generated"})
    assert trace.meta["engine"] == engine
    assert trace.meta["attention"] == ("sdpa_last" if engine == "hf" else "eager")
    check_trace(trace, ref, P, offsets, generated, set_positions, entropy_tol=SMOL_ENTROPY_TOL)
    assert trace.attention["grow"][-1].sum() > 0  # the set did grow


def test_latent_fusion_vector_by_hand(smol, smol_hf, prompt):
    with torch.inference_mode():
        out = smol_hf(prompt.tokens, output_hidden_states=True)
    logits = out.logits[0, -1]
    h = out.hidden_states[-1][0, -1]
    E = smol_hf.get_input_embeddings().weight
    alpha, top_p, temp, masked = 0.6, 0.9, 0.7, int(logits.argmax())
    # by hand: mask, softmax with temperature, walk the sorted list until the mass reaches top_p
    expect, n_kept = latent_by_hand(h, logits, E, alpha=alpha, top_p=top_p, exclude=masked, temperature=temp)
    got = latent_fusion_vector(h[None], logits[None], E, alpha=alpha, top_p=top_p,
                               temperature=temp, exclude_token=masked)[0]
    assert torch.allclose(got, expect, atol=1e-5)
    assert n_kept > 1  # the nucleus had several tokens, so the sum was exercised
    # alpha = 1 is the raw final hidden state (Coconut)
    coconut = latent_fusion_vector(h[None], logits[None], E, alpha=1.0, exclude_token=masked)[0]
    assert torch.allclose(coconut, h, atol=1e-6)


@pytest.fixture(scope="module")
def with_thinking(smol, smol_hf):
    """Copies of the bridge and of the plain model, both with <thinking> added (mean embedding)."""
    model = copy.deepcopy(smol)
    tid = lp.generation.add_thinking_token(model, "<thinking>")
    hf = copy.deepcopy(smol_hf)
    V = hf.get_input_embeddings().weight.shape[0]
    hf.resize_token_embeddings(V + 1, mean_resizing=False)
    E = hf.get_input_embeddings().weight
    with torch.no_grad():
        E[V] = E[:V].mean(0)
    assert hf.get_output_embeddings().weight.data_ptr() == E.data_ptr()  # tied, as SmolLM2
    assert tid == V
    return model, tid, hf


@pytest.mark.parametrize(("mode", "engine"), [("fusion", "bridge"), ("fusion", "hf"), ("pause", "auto")])
def test_latent_trace_matches_hand_written_inputs_embeds_loop(with_thinking, prompt, mode, engine):
    model, tid, hf = with_thinking
    think_steps = [1, 2, 6]
    thinking = lp.generation.LatentFusion(alpha=0.6, top_p=0.9) if mode == "fusion" else lp.generation.Pause()
    trace = lp.trace_generation(model, prompt, max_new_tokens=10, thinking=thinking, engine=engine,
                                think_when=lp.generation.schedule.at(think_steps), stop_at_eos=False)
    tokens, ents, attn, _ = hand_written_thinking_loop(hf, prompt, 10, think_steps, tid, fusion=mode == "fusion")
    assert trace.token_ids.tolist() == tokens
    assert trace.thinking.nonzero().flatten().tolist() == think_steps
    assert torch.allclose(trace.entropy.double(), ents, atol=SMOL_ENTROPY_TOL)
    assert torch.allclose(trace.attention["thinking"], attn, atol=TOL)
    assert trace.attention["thinking"][-1].sum() > 0


def test_batched_prompts_equal_transformers_on_smollm2(smol, smol_hf):
    a = lp.build_prompt(smol, "What is 2+2?")
    b = lp.build_prompt(smol, "Compute the sum of the first ten positive integers.", system=lp.MATH_SYSTEM_PROMPT)
    ref, P, offsets, generated = reference_generate(smol_hf, [a, b], 8)
    assert max(offsets) > 0

    def set_positions(name, r, t, seq):
        return [offsets[r] + i for i in (a, b)[r].positions("question")]

    both = lp.trace_generation(smol, [a, b], max_new_tokens=8, track={"question": "question"})
    check_trace(both, ref, P, offsets, generated, set_positions, entropy_tol=SMOL_ENTROPY_TOL)
