"""The pass@3 protocol as the authors' code ran it, and whether a model samples read from its loaded generation
configuration.

- ``model_samples`` and ``applied_sampling`` against ``transformers``' own reading of a ``generation_config.json``
  and against ``transformers.generate``: the fields said to apply are the ones ``generate`` applies.
- ``arm-aime-pass3`` on a greedy configuration (Qwen2.5-Math's kind) samples as ``generate(do_sample=True)`` does:
  the 50 most probable tokens (``transformers``' default where the configuration sets no ``top_k``), token for
  token with the same seed; on a sampling configuration, its own fields.
- The ARM attached under ``arm-aime-pass3`` has the authors' decoder-layer defaults (``range_c=0.13``,
  ``percentage=99.5`` in their modeling files; Gemma: fraction 0.13, quantile 0.995); ``arm-aime-pass3-text``
  the benchmark's preset.
"""

import json

import pytest
import torch
import transformers

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.core.models.testing import tiny_hf_model
from lensprobe.evals.running.config import EvalConfig, applied_sampling, model_samples, with_format_defaults
from lensprobe.evals.running.protocols import PROTOCOLS

SAMPLING = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20}  # Qwen2.5 Instruct's kind


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The tiny model saved with a greedy generation config (no sampling field set) and a sampling one."""
    hf, tok = tiny_hf_model(seed=0)
    root = tmp_path_factory.mktemp("gen")
    for name, gen in (("greedy", {}), ("sampling", SAMPLING)):
        hf.generation_config = transformers.GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, **gen)
        hf.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


@pytest.mark.parametrize("name", ["greedy", "sampling"])
def test_model_samples_reads_the_loaded_generation_config(folders, name):
    model = lp.load_model(folders / name)
    assert model_samples(model) is bool(transformers.GenerationConfig.from_pretrained(folders / name).do_sample)
    assert model_samples(model) is (name == "sampling")


def _plain(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


def _pass3_generation(model, n):
    config = EvalConfig(**with_format_defaults(model, {"protocol": "arm-aime-pass3"}))
    return config, config.generation().replace(seed=None, n_samples=1, max_new_tokens=n, stop_at_eos=False)


@pytest.mark.parametrize("name", ["greedy", "sampling"])
def test_pass3_samples_as_generate_do_sample_true(folders, name):
    """Token for token equal to ``generate(do_sample=True)`` with the model's own generation config, seeded alike;
    and the applied fields, passed to ``generate`` explicitly, draw the same tokens."""
    model, hf = lp.load_model(folders / name), _plain(folders / name)
    config, gen = _pass3_generation(model, 24)
    prompt = lp.build_prompt(model, "What is 3 + 7?", template="raw")
    torch.manual_seed(3)
    ours = lp.generate(model, prompt, gen).generated_ids[0]
    ids = prompt.tokens
    torch.manual_seed(3)
    theirs = hf.generate(ids, do_sample=True, max_new_tokens=24, eos_token_id=None)[0, ids.shape[1]:].tolist()
    assert ours == theirs
    applied = applied_sampling(model, config)
    explicit = {"temperature": applied["temperature"], "top_p": applied["top_p"] or 1.0, "top_k": applied["top_k"] or 0}
    torch.manual_seed(3)
    stated = hf.generate(ids, do_sample=True, max_new_tokens=24, eos_token_id=None, **explicit)[0, ids.shape[1]:]
    assert stated.tolist() == theirs
    if name == "greedy":  # the whole vocabulary (lensprobe's sampling before) draws other tokens
        torch.manual_seed(3)
        whole = hf.generate(ids, do_sample=True, max_new_tokens=24, eos_token_id=None, top_k=0)[0, ids.shape[1]:]
        assert whole.tolist() != theirs and explicit["top_k"] > 0  # so the top-k cut stated is the one applied


def test_applied_sampling_of_a_greedy_run_applies_nothing(folders):
    model = lp.load_model(folders / "greedy")
    assert applied_sampling(model) == {"do_sample": False, "temperature": None, "top_p": None, "top_k": None,
                                       "min_p": None, "repetition_penalty": None}
    sampled = applied_sampling(lp.load_model(folders / "sampling"))
    assert {k: sampled[k] for k in SAMPLING} == pytest.approx(SAMPLING)


def _arm_label(out):
    part = json.loads((out / "config.json").read_text())["parts"]["ARM"]
    (label,) = part["labels"]["interventions"]
    return label


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    hf, tok = tiny_hf_model(seed=0)
    root = tmp_path_factory.mktemp("named")
    for name in ("Qwen2.5-Math-7B", "gemma-3-27b-it"):
        hf.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


@pytest.mark.parametrize(("name", "expected"), [
    ("Qwen2.5-Math-7B", {"c": 0.13, "percentile": 99.5, "variant": "default", "p_min": 0.02}),
    ("gemma-3-27b-it", {"c": 0.13, "percentile": 0.995, "variant": "gemma"}),
])
def test_pass3_attaches_arm_at_the_layer_defaults(named, tmp_path, name, expected):
    model = lp.load_model(named / name)
    lp.evaluate(model, lp.load_math500(limit=1), "ARM", out=tmp_path / "code", benchmark="aime2024",
                protocol="arm-aime-pass3", n_samples=3, max_new_tokens=1, progress=False)
    label = _arm_label(tmp_path / "code")
    assert {k: label[k] for k in expected} == pytest.approx(expected)
    assert label["source"] == "code (layer defaults)"
    lp.evaluate(model, lp.load_math500(limit=1), "ARM", out=tmp_path / "text", benchmark="aime2024",
                protocol="arm-aime-pass3-text", arm_source="paper", n_samples=3, max_new_tokens=1, progress=False)
    text = _arm_label(tmp_path / "text")
    preset = lp.ARM.preset(name, "aime2024", source="paper")
    assert (text["c"], text["percentile"], text["source"]) == (preset.c, preset.percentile, "paper")
    assert (text["c"], text["percentile"]) != (label["c"], label["percentile"])


def test_eval_command_runs_pass3_with_the_layer_defaults(named, tmp_path):
    out = tmp_path / "run"
    assert main(["eval", "--model", str(named / "Qwen2.5-Math-7B"), "--protocol", "arm-aime-pass3", "--limit", "1",
                 "--benchmark", "aime2024", "--conditions", "ARM", "--n-samples", "3", "--max-new-tokens", "1",
                 "--no-progress", "--out", str(out)]) == 0
    label = _arm_label(out)
    assert (label["c"], label["percentile"], label["source"]) == (0.13, 99.5, "code (layer defaults)")


def test_the_pass3_protocols_list_their_difference():
    code, text = PROTOCOLS["arm-aime-pass3"], PROTOCOLS["arm-aime-pass3-text"]
    assert (code.arm, text.arm) == ("layer-defaults", "preset")
    assert code.settings == text.settings and code.system == text.system and code.k == text.k == 3
    assert "layer" in code.notes and "Table 9" in text.notes and "top_k" in code.sources["sampling"]
