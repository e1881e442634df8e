"""ARM presets per benchmark with their source: Table 9 vs the released code, "-" cells, ARM.preset."""

import pytest

import lensprobe as lp
from lensprobe.core.errors import LensprobeError
from lensprobe.interventions.arm_presets import (
    ARM_PRESETS,
    BENCHMARKS,
    DISAGREEMENTS,
    PAPER_TABLE9,
    NoPresetError,
    arm_preset,
    benchmark_key,
)


def test_every_table9_cell_is_a_preset_or_a_clear_no_gain_error():
    for model, row in PAPER_TABLE9.items():
        for bench in BENCHMARKS:
            if row[bench] is None:
                with pytest.raises(LensprobeError, match=rf"authors report no ARM gain for {model} on {bench}"):
                    arm_preset(model, bench, source="paper")
                continue
            p = arm_preset(model, bench, source="paper")
            c, pct = row[bench]
            gemma = model.startswith("gemma")
            assert p.settings["c"] == c
            assert p.settings["percentile"] == (pct / 100 if gemma else pct)  # Gemma: a quantile in [0, 1]
            assert p.settings.get("variant", "default") == ("gemma" if gemma else "default")
            assert set(p.sources.values()) <= {"paper: Table 9", "paper: Section 3 (p_min = 0.02)",
                                               "code: modeling_gemma3.py (the Gemma-3 rule)"}


def test_code_and_paper_differ_exactly_where_listed():
    differ = set()
    for bench in BENCHMARKS:
        for model in PAPER_TABLE9:
            got = {}
            for source in ("paper", "code"):
                try:
                    got[source] = arm_preset(model, bench, source=source).settings
                except LensprobeError:
                    got[source] = None
            if got["paper"] != got["code"]:
                differ.add((bench, model))
    listed = {(b, m) for b, m, *_ in DISAGREEMENTS if b != "every benchmark"}
    llama = {(b, "llama-3.1-8b-instruct") for b in BENCHMARKS if PAPER_TABLE9["llama-3.1-8b-instruct"][b]}
    assert differ == listed | llama
    gemma27 = lp.ARM.preset("google/gemma-3-27b-it", "aime2024")  # default: the code
    assert gemma27.percentile == 0.965
    assert lp.ARM.preset("google/gemma-3-27b-it", "aime2024", source="paper").percentile == 0.85
    assert arm_preset("google/gemma-3-27b-it", "aime2024").sources["percentile"] == "code: AIME2024/utils.py"
    q7 = lp.ARM.preset("Qwen/Qwen2.5-7B-Instruct", "aime25")
    assert (q7.c, q7.percentile) == (0.1, 99.5)
    assert (lp.ARM.preset("Qwen/Qwen2.5-7B-Instruct", "AIME-2025", source="paper").c,) == (0.13,)


def test_benchmarks_without_code_take_table9_with_the_code_p_min():
    p = arm_preset("meta-llama/Llama-3.1-8B-Instruct", "gpqa-diamond")
    assert p.settings == {"c": 0.45, "percentile": 80.0, "p_min": 0.2}
    assert p.sources["c"] == "paper: Table 9" and p.sources["p_min"].startswith("code: modeling_llama.py")
    assert arm_preset("meta-llama/Llama-3.1-8B-Instruct", "gpqa", source="paper").settings["p_min"] == 0.02
    gemma = lp.ARM.preset("google/gemma-3-4b-it", "livecodebench")
    assert (gemma.c, gemma.percentile, gemma.variant) == (0.25, 0.75, "gemma")


def test_no_preset_where_neither_source_has_one():
    # Qwen2.5-7B-Instruct on AIME 2024: '-' in Table 9 and None in AIME2024/utils.py
    for source in ("paper", "code"):
        with pytest.raises(LensprobeError, match=r"no ARM gain for qwen2.5-7b-instruct on aime2024.*'-' in Table 9"):
            lp.ARM.preset("Qwen/Qwen2.5-7B-Instruct", "aime2024", source=source)
    assert "qwen2.5-7b-instruct" not in ARM_PRESETS["aime2024"]
    assert ARM_PRESETS["math500"]["qwen2.5-math-7b"] == {"c": 0.1, "percentile": 95, "p_min": 0.02}


@pytest.mark.unchecked
def test_bad_names_say_what_to_use():
    with pytest.raises(LensprobeError, match=r"unknown benchmark 'gsm8k': use one of \('gpqa', 'math500'"):
        benchmark_key("gsm8k")
    with pytest.raises(LensprobeError, match=r"source must be 'paper' \(Table 9\) or 'code'"):
        lp.ARM.preset("Qwen/Qwen2.5-Math-7B", source="table")
    with pytest.raises(LensprobeError, match=r"no ARM preset for 'org/other-model'.*lp\.ARM\(c=\.\.\., percentile"):
        lp.ARM.preset("org/other-model", "aime2025")
    assert benchmark_key("MATH-500") == "math500" and benchmark_key("aime_24") == "aime2024"


def test_fallback_applies_only_where_no_preset_does():
    fallback = {"c": 0.1, "percentile": 95}
    unknown = lp.ARM.preset("org/other-model", fallback=fallback, layer=1, seed=3)  # a model without presets
    assert (unknown.c, unknown.percentile, unknown.layer, unknown.seed) == (0.1, 95, 1, 3)
    no_gain = lp.ARM.preset("Qwen/Qwen2.5-32B-Instruct", fallback=fallback)  # '-' in Table 9
    assert (no_gain.c, no_gain.percentile) == (0.1, 95)
    assert lp.ARM.preset("Qwen/Qwen2.5-Math-7B", None, fallback={"c": 0.2, "percentile": 90}).c == 0.2
    assert lp.ARM.preset("Qwen/Qwen2.5-Math-7B", "aime2024", fallback=fallback).c == 0.05  # a preset wins
    with pytest.raises(NoPresetError, match=r"no ARM preset for 'org/other-model'.*fallback="):
        lp.ARM.preset("org/other-model")
    with pytest.raises(NoPresetError, match=r"^cannot tell which benchmark these problems are.*benchmark='math500'"):
        lp.ARM.preset("Qwen/Qwen2.5-Math-7B", None)
    with pytest.raises(LensprobeError, match=r"unknown benchmark 'gsm8k'"):  # a wrong name is no missing preset
        lp.ARM.preset("org/other-model", "gsm8k", fallback=fallback)
    with pytest.raises(LensprobeError, match=r"unknown ARM field\(s\) \['cc'\]"):
        lp.ARM.preset("org/other-model", fallback={"cc": 0.1, "percentile": 95})


def loaded(arch, name: str):
    """A model as ARM.preset reads it (``cfg`` and the wrapped Hugging Face model's configuration), with the
    configuration ``arch`` and the name ``name``: no weights needed to tell which model it is."""
    from types import SimpleNamespace as NS

    cfg = NS(model_name=name, n_layers=arch.n_layers, n_heads=arch.n_heads, n_key_value_heads=arch.n_kv_heads,
             d_model=arch.d_model, d_mlp=arch.d_mlp, d_vocab=arch.d_vocab, positional_embedding_type="rotary",
             rotary_base=arch.rope_theta, n_ctx=2048)  # TransformerLens caps n_ctx; the position limit is the HF one
    return NS(cfg=cfg, original_model=NS(config=NS(model_type=arch.family, max_position_embeddings=arch.max_positions)))


def test_a_loaded_model_gets_the_preset_of_its_configuration_whatever_its_name():
    from lensprobe.interventions.arm_presets import PRESET_ARCHITECTURES, model_key

    for key, arch in PRESET_ARCHITECTURES.items():
        model = loaded(arch, "/data/checkpoints/step-1000")  # a folder: its name says nothing
        assert model_key(model) == key
        assert arm_preset(model, "humaneval", source="paper").model == key  # every model has a HumanEval cell
    # the same dimensions, told apart by the rotary base and the position limit
    math, instruct = (loaded(PRESET_ARCHITECTURES[k], "Qwen/Qwen2.5-7B-Instruct")
                      for k in ("qwen2.5-math-7b", "qwen2.5-7b-instruct"))
    assert (lp.ARM.preset(math).percentile, lp.ARM.preset(instruct).percentile) == (95, 99.5)


def test_the_name_decides_only_when_the_configuration_matches_no_model_with_presets():
    import dataclasses

    from lensprobe.core.models.facts import model_facts
    from lensprobe.core.models.testing import tiny_model
    from lensprobe.interventions.arm_presets import PRESET_ARCHITECTURES, model_key

    distill = dataclasses.replace(PRESET_ARCHITECTURES["qwen2.5-math-7b"], max_positions=131072)
    with pytest.raises(NoPresetError, match="no ARM preset for 'deepseek-r1-distill-qwen-7b'"):
        lp.ARM.preset(loaded(distill, "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"))
    assert model_key(loaded(distill, "Qwen/Qwen2.5-Math-7B")) == "qwen2.5-math-7b"  # the fallback: its name
    tiny = tiny_model(seed=0)
    tiny.cfg.model_name = "Qwen/Qwen2.5-Math-7B"
    try:
        assert lp.ARM.preset(tiny).c == 0.1  # a tiny stand-in named after the model
        facts = model_facts(tiny)
    finally:
        tiny.cfg.model_name = "lensprobe-tiny-llama"
    assert model_key(facts) == "qwen2.5-math-7b"
    renamed = dataclasses.replace(facts, name="my-run", architecture=PRESET_ARCHITECTURES["gemma-3-27b-it"])
    assert lp.ARM.preset(renamed, "aime2024").variant == "gemma"
    assert model_key(type("Plain", (), {})()).startswith("<")  # no cfg: its repr, as before


def test_preset_configurations_agree_with_the_papers_model_table():
    from lensprobe.evals.results.published import paper_models
    from lensprobe.interventions.arm_presets import PRESET_ARCHITECTURES, architecture_key

    table = paper_models()
    for key, arch in PRESET_ARCHITECTURES.items():
        row = table[key]
        assert (arch.n_layers, arch.n_heads, arch.n_kv_heads, arch.d_model, arch.d_vocab) == (
            row["n_layers"], row["n_heads"], row["n_kv_heads"], row["d_model"], row["d_vocab"]), key
        assert architecture_key(arch) == key
    assert set(PRESET_ARCHITECTURES) == set(PAPER_TABLE9)
