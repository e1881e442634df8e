"""GenerationConfig: one settings object for generate, trace_generation, the thinking study and EvalConfig."""

import dataclasses

import pytest

import lensprobe as lp
from lensprobe.core.storage.identity import identity
from lensprobe.evals.running.harness import EvalConfig
from lensprobe.generation.config import generation_config
from lensprobe.studies.thinking import compare_thinking


def test_keyword_settings_override_the_config(tiny):
    p = lp.build_prompt(tiny, "the cat", system="be brief")
    cfg = lp.GenerationConfig(max_new_tokens=4, do_sample=True, seed=1, stop_at_eos=False)
    a = lp.generate(tiny, p, cfg)
    b = lp.generate(tiny, p, max_new_tokens=4, do_sample=True, seed=1, stop_at_eos=False)
    c = lp.generate(tiny, p, cfg, max_new_tokens=2)
    assert a.token_ids_rows.tolist() == b.token_ids_rows.tolist()
    assert c.token_ids_rows.shape[1] == 2 and c.token_ids_rows[0].tolist() == a.token_ids_rows[0, :2].tolist()
    assert (a.meta["max_new_tokens"], c.meta["max_new_tokens"], c.meta["seed"]) == (4, 2, 1)


@pytest.mark.unchecked
@pytest.mark.parametrize(("settings", "message"), [
    ({}, "max_new_tokens is required"),
    ({"max_new_tokens": 0}, "max_new_tokens: expected a whole number between 1 and"),
    ({"max_new_tokens": 4, "top_n": 5}, "unknown generation setting 'top_n'"),
    ({"max_new_tokens": 4, "top_k": -1}, "top_k: expected a whole number >= 0"),
    ({"max_new_tokens": 4, "top_k": 2.5}, r"top_k: expected a whole number, got 2.5 \(float\)"),
    ({"max_new_tokens": 4, "min_p": 1.5}, r"min_p: expected a finite number >= 0 and <= 1, got 1.5"),
    ({"max_new_tokens": 4, "repetition_penalty": 0}, "repetition_penalty: expected a finite number > 0"),
    ({"max_new_tokens": 4, "repetition_penalty": float("inf")}, "repetition_penalty: expected a finite number, got inf"),
    ({"max_new_tokens": 4, "temperature": 0}, "temperature: expected a finite number >= 0.001"),
    ({"max_new_tokens": 4, "temperature": 1e-40, "do_sample": True}, "temperature: expected a finite number >= 0.001"),
    ({"max_new_tokens": 4, "temperature": float("inf")}, "temperature: expected a finite number, got inf"),
    ({"max_new_tokens": 4, "temperature": float("nan")}, "temperature: expected a finite number, got nan"),
    ({"max_new_tokens": 4, "top_p": 1.5}, r"top_p: expected a finite number > 0 and <= 1, got 1.5"),
    ({"max_new_tokens": 4, "temperature": True, "do_sample": True}, "temperature: expected a finite number, got True"),
    ({"max_new_tokens": 4, "top_p": True, "do_sample": True}, "top_p: expected a finite number, got True"),
    ({"max_new_tokens": 4, "min_p": True, "do_sample": True}, "min_p: expected a finite number or None, got True"),
    ({"max_new_tokens": 4, "seed": "1"}, "seed: expected a whole number or None, got '1'"),
    ({"max_new_tokens": 4, "n_samples": 0}, "n_samples: expected a whole number between 1 and"),
    ({"max_new_tokens": 4, "thinking": "yes"}, "thinking: expected LatentFusion or Pause or None"),
    ({"max_new_tokens": 4, "think_when": lp.generation.schedule.every(2)}, "think_when was given without thinking"),
])
def test_bad_settings_are_refused_before_any_forward(tiny, settings, message):
    p = lp.build_prompt(tiny, "the cat")
    with pytest.raises(lp.LensprobeError, match=message):
        lp.generate(tiny, p, **settings)


@pytest.mark.unchecked
def test_thinking_gets_the_emitted_schedule_and_loses_it_with_the_thinking():
    cfg = lp.GenerationConfig(8, thinking=lp.generation.Pause())
    assert cfg.think_when == lp.generation.schedule.emitted()
    plain = cfg.replace(thinking=None)
    assert plain.thinking is None and plain.think_when is None
    with pytest.raises(lp.LensprobeError, match="config must be an lp.GenerationConfig"):
        generation_config({"max_new_tokens": 3}, {})


def test_eval_config_is_a_generation_config_identified_by_every_setting():
    cfg = EvalConfig(max_new_tokens=64, batch_size=4)
    assert isinstance(cfg, lp.GenerationConfig)
    # every field, defaults and batch_size included
    assert identity(cfg) == {".type": "lensprobe.evals.running.config.EvalConfig",
                             **{f.name: identity(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}}
    assert identity(cfg)["max_new_tokens"] == 64 and identity(cfg)["batch_size"] == 4 and identity(cfg)["seed"] == 0
    sampled = EvalConfig(do_sample=True, n_samples=2, seed=5)
    assert sampled.generation().seed == 5 and cfg.generation().seed is None
    assert {k: identity(sampled)[k] for k in ("do_sample", "n_samples", "seed")} == {"do_sample": True,
                                                                                   "n_samples": 2, "seed": 5}
    thinking = EvalConfig(thinking=lp.generation.Pause(), think_when=lp.generation.schedule.every(4))
    assert identity(thinking)["thinking"][".type"] == "lensprobe.generation.thinking.latent.Pause"
    assert identity(thinking)["think_when"] != identity(thinking.replace(think_when=lp.generation.schedule.every(5)))["think_when"]
    with pytest.raises(lp.LensprobeError, match="batch_size: expected a whole number between 1 and"):
        EvalConfig(batch_size=0)
    with pytest.raises(lp.LensprobeError, match="n_samples=3 with greedy decoding"):
        EvalConfig(n_samples=3)


def test_compare_thinking_takes_a_config(tiny):
    model = lp.core.models.testing.tiny_model(seed=0)
    lp.generation.add_thinking_token(model)
    p = lp.build_prompt(model, "the cat")
    cfg = lp.GenerationConfig(6, stop_at_eos=False, think_when=None)
    traces = compare_thinking(model, p, ["pause", "none"], cfg, think_when=lp.generation.schedule.every(2))
    direct = lp.trace_generation(model, p, max_new_tokens=6, stop_at_eos=False, thinking=lp.generation.Pause(),
                                 think_when=lp.generation.schedule.every(2))
    assert traces["Pause"].thinking_rows.tolist() == direct.thinking_rows.tolist()
    assert int(direct.thinking_rows.sum()) == 3
    assert not traces["no thinking"].thinking_rows.any()
    assert traces["Pause"].meta["max_new_tokens"] == 6


@pytest.mark.unchecked
@pytest.mark.parametrize("field", ["alpha", "top_p", "temperature"])
def test_latent_fusion_refuses_a_flag_for_a_number(field):
    with pytest.raises(lp.LensprobeError, match=f"{field}: expected a finite number, got True"):
        lp.generation.LatentFusion(**{field: True})


@pytest.mark.unchecked
@pytest.mark.parametrize(("settings", "message"), [
    ({"do_sample": "false"}, r"do_sample: expected true or false \(a bool\), got 'false' \(str\)"),
    ({"stop_at_eos": "no"}, r"stop_at_eos: expected true or false \(a bool\), got 'no' \(str\)"),
    ({"n_samples": True}, r"n_samples: expected a whole number, got True \(bool\)"),
    ({"max_new_tokens": 4.0}, r"max_new_tokens: expected a whole number, got 4.0 \(float\)"),
    ({"n_samples": 2}, "n_samples=2 with greedy decoding gives 2 identical answers: set do_sample=True"),
])
def test_a_string_is_no_flag_a_flag_no_count_and_greedy_copies_are_refused(tiny, settings, message):
    p = lp.build_prompt(tiny, "the cat")
    with pytest.raises(lp.core.errors.SettingError, match=message):
        lp.generate(tiny, p, **{"max_new_tokens": 2, **settings})
    assert lp.generate(tiny, p, max_new_tokens=2, do_sample=True, n_samples=2, seed=0).n_rows == 2


def test_an_end_id_outside_the_vocabulary_is_refused_when_the_run_starts(tiny):
    p = lp.build_prompt(tiny, "the cat")
    vocab = tiny.cfg.d_vocab
    cfg = lp.GenerationConfig(2, eos_token_id=(1, vocab))  # the model is not known yet: taken
    with pytest.raises(lp.core.errors.SettingError,
                       match=rf"eos_token_id: end id\(s\) \[{vocab}\] lie outside the model's vocabulary of {vocab:,}"):
        lp.generate(tiny, p, cfg)
    assert lp.generate(tiny, p, cfg.replace(eos_token_id=vocab - 1)).n_rows == 1
