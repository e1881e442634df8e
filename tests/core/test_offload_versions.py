"""Modules on the disk under a TransformerLens whose bridge cannot run them (3.x): refused with lensprobe's
message naming the modules and the fix, a dict map before any weight is read and the map accelerate resolved
before the bridge is built. Under TransformerLens 3 the real version is refused; under 4 the version is read as
3.9.0 (and the same load without that succeeds in the offload tests)."""

from importlib.metadata import version

import pytest

import lensprobe as lp
from lensprobe.core.errors import ModelLoadError
from lensprobe.core.models import placement
from lensprobe.core.models.testing import tiny_hf_model

ON_DISK = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
           "model.layers.1": "disk", "model.norm": "cpu", "lm_head": "cpu"}


def test_disk_offload_under_transformerlens_3_is_refused_naming_the_fix(tmp_path, monkeypatch):
    hf, tok = tiny_hf_model(4)
    hf.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    if int(version("transformer-lens").split(".")[0]) >= 4:
        monkeypatch.setattr(placement, "version", lambda name: "3.9.0")
    read = []
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", lambda *a, **k: read.append(a))
    with pytest.raises(ModelLoadError) as err:
        lp.load_model(tmp_path / "tiny", device_map=ON_DISK, offload_folder=tmp_path / "offload")
    text = str(err.value)
    assert "1 module(s) on the disk (model.layers.1)" in text and "TransformerLens 3." in text
    assert "pip install 'transformer-lens>=4'" in text and "without 'disk'" in text
    assert read == []  # refused before any weight is read


def test_cpu_offload_is_not_refused_by_the_version_check(monkeypatch):
    monkeypatch.setattr(placement, "version", lambda name: "3.9.0")
    placement.check_disk_offload({"model.layers.0": "cpu", "model.layers.1": 0}, "tiny")  # TransformerLens 3 runs it
    with pytest.raises(ModelLoadError, match="on the disk"):  # a map device_map='auto' resolved, checked at boot
        placement.check_disk_offload({"model.layers.1": "disk"}, "tiny")
