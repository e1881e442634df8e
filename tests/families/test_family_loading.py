"""The family folders load through lensprobe's folder path as what they claim to be, and loading the
vision family (gemma-3-4b-it's class) installs nothing into the running environment."""

import subprocess

import pytest

import lensprobe as lp
from lensprobe.core.models.families import FAMILIES, family, tiny_family_folder


def test_each_folder_is_its_family(fam):
    config = fam.plain.config
    text = config.get_text_config()
    assert type(fam.model.original_model).__name__ == fam.family.architecture
    assert fam.model.cfg.n_layers == text.num_hidden_layers and fam.model.cfg.n_heads == text.num_attention_heads
    name = fam.family.name
    if name == "qwen2":
        assert fam.plain.model.layers[0].self_attn.q_proj.bias is not None  # q/k/v biases
    if name == "llama3":
        assert text.rope_parameters["rope_type"] == "llama3"
    if name.startswith("gemma"):
        assert text.layer_types[:2] == ["sliding_attention", "full_attention"]
        assert fam.layers()[0].self_attn.q_norm is not None and fam.layers()[0].self_attn.k_norm is not None
    stops = set(fam.plain.generation_config.eos_token_id)
    assert stops == set(fam.tokenizer.convert_tokens_to_ids(list(fam.family.stops)))
    bos = fam.tokenizer("x").input_ids[0] == fam.tokenizer.bos_token_id
    assert bos == (fam.family.bos is not None)


def test_same_seed_same_weights(tmp_path):
    import safetensors.torch

    a, b, c = (tiny_family_folder("qwen2", tmp_path / n, seed=s) for n, s in (("a", 0), ("b", 0), ("c", 1)))
    wa, wb, wc = (safetensors.torch.load_file(f / "model.safetensors") for f in (a, b, c))
    assert all((wa[k] == wb[k]).all() for k in wa)
    assert any((wa[k] != wc[k]).any() for k in wa)


def test_loading_the_vision_family_runs_no_package_install(family_folders, monkeypatch):
    """TransformerLens pip-installs torchvision when a multimodal model's processor does not load;
    lensprobe refuses that install (it would change the environment every other import depends on)."""
    calls = []

    def record(args, *rest, **kwargs):
        calls.append(list(args))
        raise subprocess.CalledProcessError(1, args)

    monkeypatch.setattr(subprocess, "check_call", record)
    model = lp.load_model(family_folders["gemma3-vision"], device="cpu")
    assert type(model.original_model).__name__ == "Gemma3ForConditionalGeneration"
    assert calls == []


@pytest.mark.parametrize("name", ["mistral", ""])
def test_unknown_family_is_refused(name):
    with pytest.raises(lp.LensprobeError, match=r"unknown model family .* use one of \('qwen2'"):
        family(name)
    assert FAMILIES == ("qwen2", "llama3", "gemma3", "gemma3-vision")
