"""The model's facts read once (lensprobe.core.models.facts): what they hold, and that lp.evaluate reads them
once per run and passes them down instead of asking the model again at every level."""

import collections
import sys

import pytest
import torch

import lensprobe as lp
from lensprobe.core.models.facts import ModelFacts, architecture, end_ids, model_facts, pad_id
from lensprobe.core.models.testing import tiny_model
from lensprobe.evals.problems.load import Problem


def test_facts_are_the_models_own():
    model = tiny_model(seed=0)
    facts = model_facts(model)
    cfg = model.cfg
    assert facts.tokenizer is model.tokenizer
    assert (facts.n_ctx, facts.d_vocab, facts.n_layers, facts.n_heads) == (
        cfg.n_ctx, cfg.d_vocab, cfg.n_layers, cfg.n_heads)
    assert facts.end_ids == (model.tokenizer.eos_token_id,)
    assert facts.pad_id == model.tokenizer.pad_token_id
    assert (facts.device, facts.dtype) == (torch.device("cpu"), torch.float32)
    assert facts.name == "lensprobe-tiny-llama"
    assert (facts.weights_digest, facts.engine) == (None, None)  # filled by the run identity, not here
    arch = facts.architecture
    assert (arch.family, arch.n_layers, arch.n_heads, arch.n_kv_heads, arch.d_model, arch.d_mlp, arch.d_vocab,
            arch.rope_theta, arch.max_positions) == ("llama", 2, 4, 2, 64, 128, 400, 10000.0, 256)
    assert "AddedToken" not in repr(facts)  # the tokenizer is not printed


def test_end_ids_join_the_tokenizer_and_the_generation_config():
    model = tiny_model(seed=0)
    model.original_model.generation_config.eos_token_id = [7, 2, 5]
    try:
        assert model_facts(model).end_ids == (2, 5, 7)
    finally:
        model.original_model.generation_config.eos_token_id = 2
    tok = type("Tok", (), {"eos_token_id": 9, "pad_token_id": None})()
    assert end_ids(tok, type("Gen", (), {"eos_token_id": 4})()) == (4, 9)
    assert end_ids(None) == ()
    assert pad_id(tok) == 9 and pad_id(None) == 0


def test_a_model_without_rotary_embeddings_has_no_rope_theta():
    model = tiny_model(seed=0)
    model.cfg.positional_embedding_type = "standard"
    try:
        assert architecture(model).rope_theta is None
    finally:
        model.cfg.positional_embedding_type = "rotary"


@pytest.fixture
def counted(monkeypatch):
    """How many ModelFacts are made."""
    made = []
    init = ModelFacts.__init__

    def counting(self, *args, **kwargs):
        made.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(ModelFacts, "__init__", counting)
    return made


def test_evaluate_reads_the_facts_once_for_every_generation(tiny, counted, monkeypatch):
    from lensprobe.evals.running import execute as running

    calls = []
    real = running.generate

    def spy(*args, **kwargs):
        calls.append(kwargs.get("facts"))
        return real(*args, **kwargs)

    monkeypatch.setattr(running, "generate", spy)
    probs = [Problem(id=str(i), problem=f"What is {i} + {i}?", answer=str(2 * i)) for i in range(3)]
    rows = lp.evaluate(tiny, probs, "w/o,w/ Mless,ARM", max_new_tokens=3, batch_size=1, progress=False,
                       arm=lp.ARM(c=0.1, percentile=95, seed=0, per_row=False))  # per_row=False: one call per row
    assert len(rows) == 9 and len(calls) >= 5
    assert len(counted) == 1
    assert all(isinstance(f, ModelFacts) for f in calls) and len({id(f) for f in calls}) == 1


def test_generate_alone_reads_the_facts_itself(tiny, counted):
    out = lp.generate(tiny, [[5, 6, 7]], max_new_tokens=2)
    given = lp.generate(tiny, [[5, 6, 7]], max_new_tokens=2, facts=model_facts(tiny))
    assert len(counted) == 2 and out.texts == given.texts


def reads_during(fn, model) -> collections.Counter:
    """Reads of ``model.cfg`` / ``model.tokenizer`` / ``model.original_model`` by lensprobe module during ``fn()``."""
    reads: collections.Counter = collections.Counter()
    base = type(model)

    def __getattribute__(self, name):
        if name in ("cfg", "tokenizer", "original_model"):
            caller = sys._getframe(1).f_globals.get("__name__", "?")
            if caller.startswith("lensprobe."):
                reads[caller] += 1
        return base.__getattribute__(self, name)

    model.__class__ = type(base.__name__, (base,), {"__getattribute__": __getattribute__})
    try:
        fn()
    finally:
        model.__class__ = base
    return reads


def test_the_evaluation_and_the_generation_loop_do_not_ask_the_model_for_its_facts():
    model = tiny_model(seed=0)
    probs = [Problem(id=str(i), problem=f"What is {i} + {i}?", answer=str(2 * i)) for i in range(2)]
    reads = reads_during(lambda: lp.evaluate(model, probs, "w/o,w/ Mless", max_new_tokens=3, progress=False), model)
    assert reads["lensprobe.core.models.facts"] > 0  # read there, once
    # what is left besides these: the run identity (its conditions' descriptions build a prompt from the model),
    # the plain engine's one check of its view, the trace's model name (one read per generation call)
    pipeline = ("lensprobe.evals.", "lensprobe.generation.", "lensprobe.core.hooks.")
    asked = {m: n for m, n in reads.items() if m.startswith(pipeline)
             and m not in ("lensprobe.generation.engines.view", "lensprobe.generation.loop")}
    assert asked == {}
    assert reads["lensprobe.generation.loop"] <= 2  # two conditions: two generation calls


@pytest.mark.parametrize("template", ["chat", "plain", "raw"])
def test_prompts_built_from_the_facts_equal_those_built_from_the_model(template):
    model = tiny_model(seed=0)
    facts = model_facts(model)
    kwargs = {"system": "Be brief.", "filler": lp.Filler.meaningless(), "template": template}
    a, b = lp.build_prompt(model, "What is 1+1?", **kwargs), lp.build_prompt(facts, "What is 1+1?", **kwargs)
    assert (a.tokens.tolist(), a.segments, a.text) == (b.tokens.tolist(), b.segments, b.text)
    from lensprobe.core.prompts.conditions import resolve_conditions

    for cond in resolve_conditions("w/o,w/ Mless,random sentence"):
        assert cond.prompt_builder(model)("2+2?").tokens.tolist() == cond.prompt_builder(model, facts)("2+2?").tokens.tolist()
    long = "word " * (facts.n_ctx + 10)
    with pytest.raises(lp.LensprobeError, match=f"the model's context is {facts.n_ctx}"):
        lp.build_prompt(facts, long, template=template)


def test_token_checks_read_the_facts():
    from lensprobe.core.hooks.forward import as_tokens, outside_vocabulary

    model = tiny_model(seed=0)
    facts = model_facts(model)
    assert as_tokens(facts, [1, 2, 3]).device == facts.device
    assert outside_vocabulary(facts, [1, facts.d_vocab]) == outside_vocabulary(model, [1, facts.d_vocab]) == (
        f"token id {facts.d_vocab} is outside the vocabulary (0-{facts.d_vocab - 1}).")
    with pytest.raises(lp.LensprobeError, match=f"the model's context is {facts.n_ctx}"):
        as_tokens(facts, list(range(facts.n_ctx + 1)))


def test_a_given_facts_is_what_generate_reads(tiny):
    """lp.generate takes the tokenizer, end ids and context from the facts it is given, not from the model."""
    import dataclasses

    facts = model_facts(tiny)
    free = lp.generate(tiny, [[5, 6, 7]], max_new_tokens=6, stop_at_eos=True, facts=facts)
    first = int(free.generated_ids[0][0])
    stopped = lp.generate(tiny, [[5, 6, 7]], max_new_tokens=6, facts=dataclasses.replace(facts, end_ids=(first,)))
    assert stopped.generated_ids[0] == [first] and stopped.finish_reasons[0] == "eos"
    with pytest.raises(lp.LensprobeError, match="context of 4 tokens"):
        lp.generate(tiny, [[5, 6, 7]], max_new_tokens=2, facts=dataclasses.replace(facts, n_ctx=4))


def test_trace_prompts_reads_the_facts_once_for_all_its_prompts(tiny, counted):
    traces = lp.generation.trace_prompts(tiny, {"a": [5, 6, 7], "b": [8, 9], "c": [4]}, max_new_tokens=2,
                                         progress=False)
    assert sorted(traces) == ["a", "b", "c"] and len(counted) == 1
    alone = lp.trace_generation(tiny, [8, 9], max_new_tokens=2)
    assert traces["b"].generated_ids == alone.generated_ids
