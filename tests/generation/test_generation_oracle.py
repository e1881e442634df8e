"""Oracle tests on the embedded SmolLM2: the traced numbers, computed a second way with plain transformers."""

import copy

import pytest
import torch

import lensprobe as lp
from lensprobe.generation.thinking import latent_fusion_vector

pytestmark = pytest.mark.slow

N_STEPS = 16


@pytest.fixture(scope="module")
def hf_model():
    """A fresh Hugging Face model from the same converted files, with no bridge around it."""
    from transformers import AutoModelForCausalLM

    from lensprobe.core.models import converted_gguf_folder, embedded_gguf_path, quiet

    with quiet():
        hf = AutoModelForCausalLM.from_pretrained(
            str(converted_gguf_folder(embedded_gguf_path())), attn_implementation="eager", dtype=torch.float32
        )
    return hf.eval()


@pytest.fixture(scope="module")
def prompt(smol):
    return lp.build_prompt(smol, "What is 12+7? Answer briefly.", system=lp.MATH_SYSTEM_PROMPT)


def _entropy_by_hand(logits: torch.Tensor) -> float:
    p = torch.softmax(logits.double(), -1)
    return float(-(p[p > 0] * p[p > 0].log()).sum())


@pytest.mark.parametrize("engine", ["bridge", "hf"])
def test_entropy_and_attention_match_transformers_generate(smol, hf_model, prompt, engine):
    toks = prompt.tokens
    with torch.inference_mode():
        ref = hf_model.generate(
            toks, attention_mask=torch.ones_like(toks), max_new_tokens=N_STEPS, do_sample=False,
            output_scores=True, output_attentions=True, return_dict_in_generate=True,
            pad_token_id=smol.tokenizer.eos_token_id,
        )
    P = toks.shape[1]
    ref_tokens = ref.sequences[0, P:].tolist()
    # a token set that grows during generation: the most frequent generated token
    grow = max(set(ref_tokens), key=ref_tokens.count)
    trace = lp.trace_generation(smol, prompt, max_new_tokens=N_STEPS, engine=engine,
                                track={"system": "system", "grow": grow, "generated": "generated"})
    assert trace.meta["engine"] == engine
    assert trace.meta["attention"] == ("sdpa_last" if engine == "hf" else "eager")
    n = len(ref_tokens)
    assert n >= 8
    assert trace.token_ids[:n].tolist() == ref_tokens
    # (a) entropy of the next-token distribution equals transformers' scores, step by step
    for t in range(n):
        assert abs(float(trace.entropy[t]) - _entropy_by_hand(ref.scores[t][0])) <= 1e-4, t
        p_chosen = torch.softmax(ref.scores[t][0].double(), -1)[ref_tokens[t]]
        assert abs(float(trace.chosen_prob[t]) - float(p_chosen)) <= 1e-4
    # (b) attention proportion = row sums of transformers' attentions over the tracked positions
    seq = ref.sequences[0].tolist()
    sys_pos = prompt.positions("system")
    for t in range(n):
        K = P + t  # keys visible to the step's query (position P - 1 + t)
        sets = {"system": sys_pos, "grow": [i for i in range(K) if seq[i] == grow],
                "generated": list(range(P, K))}
        for layer in range(smol.cfg.n_layers):
            row = ref.attentions[t][layer][0, :, -1, :K]  # [head, key]
            for name, pos in sets.items():
                expect = row[:, pos].sum(-1) if pos else torch.zeros(row.shape[0])
                got = trace.attention[name][t, layer]
                assert torch.allclose(got, expect, atol=1e-5), (name, t, layer)
    assert trace.attention["grow"][-1].sum() > 0  # the set did grow


def test_latent_fusion_vector_by_hand(smol, hf_model, prompt):
    with torch.inference_mode():
        out = hf_model(prompt.tokens, output_hidden_states=True)
    logits = out.logits[0, -1]
    h = out.hidden_states[-1][0, -1]
    E = hf_model.get_input_embeddings().weight
    alpha, top_p, temp, masked = 0.6, 0.9, 0.7, int(logits.argmax())
    # by hand: mask, softmax with temperature, walk the sorted list until the mass reaches top_p
    z = [float(v) / temp for v in logits.double()]
    z[masked] = float("-inf")
    zmax = max(z)
    w = [0.0 if v == float("-inf") else pow(2.718281828459045, v - zmax) for v in z]
    total = sum(w)
    probs = sorted(((wi / total, i) for i, wi in enumerate(w)), reverse=True)
    kept, mass = [], 0.0
    for p_i, i in probs:
        if mass >= top_p:
            break
        kept.append((p_i, i))
        mass += p_i
    norm = sum(p_i for p_i, _ in kept)
    soft = sum((p_i / norm) * E[i].double() for p_i, i in kept)
    expect = alpha * h.double() + (1 - alpha) * soft
    got = latent_fusion_vector(h[None], logits[None], smol.W_E, alpha=alpha, top_p=top_p,
                               temperature=temp, exclude_token=masked)[0]
    assert torch.allclose(got.double(), expect, atol=1e-5)
    assert len(kept) > 1  # the nucleus had several tokens, so the sum was exercised
    # alpha = 1 is the raw final hidden state (Coconut); alpha = 0 the weighted embedding
    coconut = latent_fusion_vector(h[None], logits[None], smol.W_E, alpha=1.0, exclude_token=masked)[0]
    assert torch.allclose(coconut, h, atol=1e-6)


def _hf_with_thinking_token(hf_model):
    hf = copy.deepcopy(hf_model)
    V = hf.get_input_embeddings().weight.shape[0]
    hf.resize_token_embeddings(V + 1, mean_resizing=False)
    E = hf.get_input_embeddings().weight
    with torch.no_grad():
        E[V] = E[:V].mean(0)
    assert hf.get_output_embeddings().weight.data_ptr() == E.data_ptr()  # tied, as SmolLM2
    return hf, V


@pytest.fixture(scope="module")
def with_thinking(smol, hf_model):
    """Copies of the bridge and of the plain model, both with <thinking> added (mean embedding)."""
    model = copy.deepcopy(smol)
    tid = lp.add_thinking_token(model, "<thinking>")
    hf, V = _hf_with_thinking_token(hf_model)
    assert tid == V
    return model, tid, hf, V


@pytest.mark.parametrize(("mode", "engine"), [("fusion", "bridge"), ("fusion", "hf"), ("pause", "auto")])
def test_latent_trace_matches_hand_written_inputs_embeds_loop(with_thinking, prompt, mode, engine):
    model, tid, hf, V = with_thinking
    think_steps = [1, 2, 6]
    alpha, top_p = 0.6, 0.9
    thinking = lp.LatentFusion(alpha=alpha, top_p=top_p) if mode == "fusion" else lp.Pause()
    trace = lp.trace_generation(model, prompt, max_new_tokens=10, thinking=thinking, engine=engine,
                                think_when=lp.schedule.at(think_steps), stop_at_eos=False)
    E = hf.get_input_embeddings().weight
    P = prompt.tokens.shape[1]
    tokens, ents, attn = [], [], []
    with torch.inference_mode():
        out = hf(prompt.tokens, use_cache=True, output_hidden_states=True, output_attentions=True)
        for t in range(10):
            logits, h = out.logits[0, -1], out.hidden_states[-1][0, -1]
            ents.append(_entropy_by_hand(logits))
            thinking_pos = [P + i for i in range(t) if i in think_steps]
            attn.append(torch.stack([a[0, :, -1, thinking_pos].sum(-1) for a in out.attentions]))
            tok = int(logits.argmax())
            if t in think_steps:
                tok = tid
                if mode == "fusion":
                    p = torch.softmax(logits.masked_fill(torch.arange(V + 1) == tid, float("-inf")), -1)
                    sp, order = p.sort(descending=True)
                    keep = order[(sp.cumsum(0) - sp) < top_p]
                    q = torch.zeros_like(p)
                    q[keep] = p[keep] / p[keep].sum()
                    emb = alpha * h + (1 - alpha) * (q @ E)
                else:
                    emb = E[tid]
            else:
                emb = E[tok]
            tokens.append(tok)
            out = hf(inputs_embeds=emb[None, None], past_key_values=out.past_key_values, use_cache=True,
                     output_hidden_states=True, output_attentions=True)
    assert trace.token_ids.tolist() == tokens
    assert trace.thinking.nonzero().flatten().tolist() == think_steps
    assert torch.allclose(trace.entropy.double(), torch.tensor(ents, dtype=torch.float64), atol=1e-4)
    assert torch.allclose(trace.attention["thinking"], torch.stack(attn), atol=1e-5)
    assert trace.attention["thinking"][-1].sum() > 0


def test_batched_prompts_equal_one_by_one_on_smollm2(smol):
    a = lp.build_prompt(smol, "What is 2+2?")
    b = lp.build_prompt(smol, "Compute the sum of the first ten positive integers.", system=lp.MATH_SYSTEM_PROMPT)
    track = {"question": "question"}
    both = lp.trace_generation(smol, [a, b], max_new_tokens=8, track=track, stop_at_eos=False)
    for i, p in enumerate((a, b)):
        alone = lp.trace_generation(smol, p, max_new_tokens=8, track=track, stop_at_eos=False)
        assert both.token_ids_rows[i].tolist() == alone.token_ids.tolist()
        assert torch.allclose(both.entropy_rows[i], alone.entropy, atol=1e-4)
        assert torch.allclose(both.attention_rows["question"][i], alone.attention["question"], atol=1e-4)
