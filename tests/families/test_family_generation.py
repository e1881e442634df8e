"""KV-cached generation for each family against plain ``transformers`` ``generate`` (greedy, scores and
attentions kept; left-padded batches; Gemma's sliding-window cache), and continuous batching against each
prompt run alone."""

from types import SimpleNamespace

import pytest
import torch
from generation.test_generation_oracle import check_trace, reference_generate
from oracles import assert_rows_equal_solo

import lensprobe as lp

TEXTS = ("What is 12+7?", "the cat sat on the mat and the dog sat on the cat", "x",
         "The quick brown fox jumps over the lazy dog. 0 1 2 3", "0 1 2")
CAPS = [5, 9, 3, 7, 4]


@pytest.fixture(scope="module")
def prompts(fam):
    ps = [lp.build_prompt(fam.model, t, system="You answer.") for t in TEXTS]
    assert len({len(p) for p in ps}) == len(ps)  # every length differs: padding happens
    return ps


def over_every_key(ref, P: int):
    """``ref`` with each step's attention weights over every key so far: a sliding-window layer's cache
    holds only the window's last keys, so transformers returns weights over those; the keys before
    them get no attention (the window's definition), written as zeros in front."""
    steps = []
    for t, layers in enumerate(ref.attentions):
        K = P + t
        steps.append(tuple(torch.nn.functional.pad(a, (K - a.shape[-1], 0)) if t else a for a in layers))
    return SimpleNamespace(sequences=ref.sequences, scores=ref.scores, attentions=tuple(steps))


@pytest.mark.parametrize("engine", ["bridge", "hf"])
def test_trace_equals_transformers_generate(fam, prompts, engine):
    chosen = prompts[:2]
    n = 12  # past Gemma's sliding window of 6: the cache keeps only the window's keys for layer 0
    ref, P, offsets, generated = reference_generate(fam.plain, chosen, n)
    assert max(offsets) > 0 and len(generated[0]) > 6
    ref = over_every_key(ref, P)

    def set_positions(name, r, t, seq):
        if name == "system":
            return [offsets[r] + i for i in chosen[r].positions("system")]
        return list(range(P, P + t))  # "generated"

    trace = lp.trace_generation(fam.model, chosen, max_new_tokens=n, track={"system": "system", "generated": "generated"},
                                engine=engine)
    assert trace.meta["engine"] == engine
    check_trace(trace, ref, P, offsets, generated, set_positions)


@pytest.mark.parametrize("engine", ["bridge", "hf"])
def test_continuous_batching_equals_each_prompt_alone(fam, prompts, engine):
    out = lp.generate(fam.model, prompts, max_new_tokens=max(CAPS), batch_size=2, caps=CAPS, stop_at_eos=False,
                      engine=engine)
    assert out.meta["batching"] == "continuous batching" and out.meta["engine"] == engine
    assert_rows_equal_solo(out, fam.model, prompts, CAPS, engine=engine)


def test_continuous_batching_of_prompts_shorter_than_the_window_equals_each_alone(fam):
    """Token-id prompts of 2 to 12 tokens (Gemma's window keeps 5 past keys): rows whose whole past fits
    in the window join rows whose window has slid."""
    ids = fam.tokenizer(TEXTS[3]).input_ids
    prompts = [ids[:2], ids[:9], ids[:3], ids[:12], ids[:5]]
    out = lp.generate(fam.model, prompts, max_new_tokens=max(CAPS), batch_size=2, caps=CAPS, stop_at_eos=False)
    assert out.meta["batching"] == "continuous batching"
    assert_rows_equal_solo(out, fam.model, prompts, CAPS)


def test_continuous_batching_with_the_family_arm_preset_equals_each_prompt_alone(fam, prompts):
    arm = lp.ARM.preset(fam.family.paper_model, "math500", seed=0)
    out = lp.generate(fam.model, prompts, max_new_tokens=max(CAPS), batch_size=2, caps=CAPS, stop_at_eos=False,
                      interventions=[arm])
    assert out.meta["batching"] == "continuous batching"
    assert_rows_equal_solo(out, fam.model, prompts, CAPS, interventions=[arm])
