"""Sampling as ``transformers`` applies it: the processed distribution equals ``LogitsProcessorList`` on the
same logits (repetition penalty, temperature, top-k, top-p, min-p, in transformers' order), and generations
equal ``transformers.generate`` token for token (greedy with a repetition penalty; sampling from torch's
global generator seeded alike), on the tiny model with both engines, under continuous batching, and on the
embedded model."""

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import lensprobe as lp
from lensprobe.generation.sampling import penalised_scores, sampling_probs

SETTINGS = [
    dict(repetition_penalty=1.3),
    dict(temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.05),  # Qwen2.5 Instruct's generation config
    dict(temperature=1.0, top_k=64, top_p=0.95),  # Gemma 3's
    dict(min_p=0.05),
    dict(temperature=0.6, top_p=0.9, min_p=0.1, top_k=5, repetition_penalty=0.8),
]


def hf_processors(s: dict) -> LogitsProcessorList:
    procs = LogitsProcessorList()
    if s.get("repetition_penalty", 1.0) != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(s["repetition_penalty"]))
    if s.get("temperature", 1.0) != 1.0:
        procs.append(TemperatureLogitsWarper(s["temperature"]))
    if s.get("top_k", 0):
        procs.append(TopKLogitsWarper(s["top_k"]))
    if s.get("top_p", 1.0) < 1.0:
        procs.append(TopPLogitsWarper(s["top_p"]))
    if s.get("min_p") is not None:
        procs.append(MinPLogitsWarper(s["min_p"]))
    return procs


@pytest.mark.parametrize("s", SETTINGS)
def test_the_distribution_equals_transformers_logits_processors(s):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 300, generator=g) * 3
    input_ids = torch.randint(0, 300, (6, 25), generator=g)
    want = hf_processors(s)(input_ids, logits.clone()).softmax(-1)
    seen = torch.zeros(6, 300, dtype=torch.bool).scatter(1, input_ids, True)
    got = sampling_probs(penalised_scores(logits, seen, s.get("repetition_penalty", 1.0)),
                         **{k: v for k, v in s.items() if k != "repetition_penalty"})
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert ((got > 0) == (want > 0)).all()  # the same tokens kept


def test_penalty_by_hand():
    scores = penalised_scores(torch.tensor([[2.0, -2.0, 1.0, -1.0]]), torch.tensor([[True, True, False, False]]), 2.0)
    assert scores.tolist() == [[1.0, -4.0, 1.0, -1.0]]
    assert sampling_probs(torch.tensor([[3.0, 3.0, 1.0, 0.0]]), top_k=1)[0, 2:].tolist() == [0.0, 0.0]  # ties kept


def hf_generate(hf, ids, n, s):
    kw = {"top_k": 0, "top_p": 1.0, "temperature": 1.0} | s
    return hf.generate(ids, max_new_tokens=n, eos_token_id=None, pad_token_id=0, **kw)[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("engine", ["hf", "bridge"])
@pytest.mark.parametrize("s", [dict(do_sample=False, repetition_penalty=1.3)] + [dict(do_sample=True, **s) for s in SETTINGS])
def test_generation_equals_transformers_generate(tiny, tiny_hf, engine, s):
    p = lp.build_prompt(tiny, "the cat sat on the mat")
    torch.manual_seed(0)
    out = lp.generate(tiny, p, max_new_tokens=20, stop_at_eos=False, engine=engine, **s)
    torch.manual_seed(0)
    assert out.generated_ids[0] == hf_generate(tiny_hf, p.tokens, 20, s)
    assert out.meta["repetition_penalty"] == s.get("repetition_penalty", 1.0)


def test_continuous_batching_applies_each_rows_own_penalty(tiny, tiny_hf):
    texts = ["the cat sat on the mat", "x", "What is 12+7?", "0 1 2 3 4 5"]
    prompts = [lp.build_prompt(tiny, t) for t in texts]
    s = dict(do_sample=False, repetition_penalty=1.5)
    out = lp.generate(tiny, prompts, max_new_tokens=12, caps=[12, 5, 9, 7], stop_at_eos=False, batch_size=2, **s)
    assert out.meta["batching"] == "continuous batching"
    for r, (p, cap) in enumerate(zip(prompts, [12, 5, 9, 7], strict=True)):
        assert out.generated_ids[r] == hf_generate(tiny_hf, p.tokens, cap, s), r
    seeded = dict(do_sample=True, seed=3, top_k=10, repetition_penalty=1.2, n_samples=2)
    both = lp.generate(tiny, prompts, max_new_tokens=8, stop_at_eos=False, batch_size=3, **seeded)
    for r, p in enumerate(prompts):
        alone = lp.generate(tiny, p, max_new_tokens=8, stop_at_eos=False, **seeded)
        assert both.generated_ids[2 * r:2 * r + 2] == alone.generated_ids, r


@pytest.mark.slow
def test_greedy_with_a_repetition_penalty_equals_transformers_on_the_embedded_model(smol, smol_hf):
    p = lp.build_prompt(smol, "List the first ten prime numbers.")
    plain = lp.generate(smol, p, max_new_tokens=40, stop_at_eos=False)
    for penalty in (1.05, 1.3):  # Qwen2.5 Instruct's value, and one that changes this answer
        s = dict(do_sample=False, repetition_penalty=penalty)
        out = lp.generate(smol, p, max_new_tokens=40, stop_at_eos=False, **s)
        assert out.generated_ids[0] == hf_generate(smol_hf, p.tokens, 40, s), penalty
    assert plain.generated_ids[0] != out.generated_ids[0]
