"""A model accelerate put partly on the disk under a TransformerLens whose bridge cannot run it (3.x): refused
with lensprobe's message naming the modules and the fix, before the bridge is built. Under TransformerLens 3 the
real version is refused; under 4 the version is read as 3.9.0 (and the same load without that succeeds in the
offload tests)."""

from importlib.metadata import version

import pytest

import lensprobe as lp
from lensprobe.core.errors import ModelLoadError
from lensprobe.core.models import boot
from lensprobe.core.models.testing import tiny_hf_model

ON_DISK = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
           "model.layers.1": "disk", "model.norm": "cpu", "lm_head": "cpu"}


def test_disk_offload_under_transformerlens_3_is_refused_naming_the_fix(tmp_path, monkeypatch):
    hf, tok = tiny_hf_model(4)
    hf.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    if int(version("transformer-lens").split(".")[0]) >= 4:
        monkeypatch.setattr(boot, "version", lambda name: "3.9.0")
    with pytest.raises(ModelLoadError) as err:
        lp.load_model(tmp_path / "tiny", device_map=ON_DISK, offload_folder=tmp_path / "offload")
    text = str(err.value)
    assert "1 module(s) on the disk (model.layers.1)" in text and "TransformerLens 3." in text
    assert "pip install 'transformer-lens>=4'" in text and "without 'disk'" in text


def test_cpu_offload_is_not_refused_by_the_version_check(monkeypatch):
    class Placed:
        hf_device_map = {"model.layers.0": "cpu", "model.layers.1": 0}

    monkeypatch.setattr(boot, "version", lambda name: "3.9.0")
    boot.check_disk_offload(Placed(), "tiny")  # no disk: TransformerLens 3 runs it
    Placed.hf_device_map = {"model.layers.1": "disk"}
    with pytest.raises(ModelLoadError, match="on the disk"):
        boot.check_disk_offload(Placed(), "tiny")
