"""The converted-model cache (lensprobe.core.models.cache) on a tiny model: built once and reused, built
again when its key changes or a file is damaged, one build when two processes ask at once.

The conversion here copies a tiny saved Llama folder (a stand-in for dequantising a GGUF file, which
tests/core/test_models.py does for real); the source file is any file: the cache keys it by its bytes.
"""

import json
import multiprocessing
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch

from lensprobe.core.errors import LensprobeError, ModelLoadError
from lensprobe.core.models import cache
from lensprobe.core.models.cache import MANIFEST, cache_dir, cached_conversion, folder_intact
from lensprobe.core.storage.locks import FileLock


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A tiny Llama saved as a Hugging Face folder (config, tokenizer, model.safetensors), and its logits."""
    from lensprobe.core.models.testing import tiny_hf_model

    hf, tok = tiny_hf_model(seed=3)
    folder = tmp_path_factory.mktemp("tiny-template")
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    with torch.inference_mode():
        logits = hf(torch.tensor([[1, 5, 9, 2]])).logits
    return folder, logits


class Converter:
    """Copies the template into the folder asked for; counts its calls in a file (so across processes)."""

    def __init__(self, template: Path, calls: Path, pause: float = 0.0) -> None:
        self.template, self.calls, self.pause = template, calls, pause

    def __call__(self, source: Path, folder: Path) -> None:
        with open(self.calls, "a") as fh:
            fh.write(f"{source.name}\n")
        time.sleep(self.pause)
        shutil.copytree(self.template, folder)

    @property
    def count(self) -> int:
        return len(self.calls.read_text().splitlines()) if self.calls.exists() else 0


@pytest.fixture
def env(tmp_path, monkeypatch, template):
    """An empty cache folder, a source file and a counting converter."""
    monkeypatch.setenv("LENSPROBE_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    return source, Converter(template[0], tmp_path / "calls.txt")


def logits_of(folder: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32).eval()
    with torch.inference_mode():
        return hf(torch.tensor([[1, 5, 9, 2]])).logits


def test_built_once_then_reused_with_a_manifest(env, template):
    source, convert = env
    folder = cached_conversion(source, convert)
    assert convert.count == 1 and folder.parent == cache_dir() and folder.name.startswith("model-")
    manifest = json.loads((folder / MANIFEST).read_text())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= manifest["files"].keys()
    assert manifest["versions"] == cache.conversion_versions() and manifest["source"]["name"] == "model.gguf"
    assert cached_conversion(source, convert) == folder and convert.count == 1
    assert sorted(p.name for p in cache_dir().iterdir()) == [folder.name]  # no lock or temporary left
    torch.testing.assert_close(logits_of(folder), template[1], rtol=0, atol=0)


def test_the_same_bytes_elsewhere_or_touched_share_the_folder(env, tmp_path):
    source, convert = env
    folder = cached_conversion(source, convert)
    copy = tmp_path / "elsewhere" / "model.gguf"
    copy.parent.mkdir()
    shutil.copy(source, copy)
    source.touch()
    assert cached_conversion(copy, convert) == folder == cached_conversion(source, convert)
    assert convert.count == 1


def test_a_changed_file_or_version_builds_another_folder(env, monkeypatch):
    source, convert = env
    first = cached_conversion(source, convert)
    source.write_bytes(source.read_bytes()[:-1] + b"x")  # same size
    second = cached_conversion(source, convert)
    assert second != first and convert.count == 2
    monkeypatch.setattr(cache, "CONVERSION_VERSION", cache.CONVERSION_VERSION + 1)
    third = cached_conversion(source, convert)
    assert third not in (first, second) and convert.count == 3
    assert all(folder_intact(f) for f in (first, second, third))


def test_digests_are_remembered_in_this_process_only(env):
    """A file damaged in the middle with its size and modification time kept is found by the next process
    (nothing remembered on disk), before the folder is used."""
    source, convert = env
    folder = cached_conversion(source, convert)
    assert [p.name for p in cache_dir().iterdir()] == [folder.name]  # no digest kept on disk
    weights = folder / "model.safetensors"
    before = weights.stat()
    with open(weights, "r+b") as fh:
        fh.seek(before.st_size // 2)
        fh.write(b"\xff" * 16)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    cache._DIGESTS.clear()  # a new process
    assert not folder_intact(folder)
    assert cached_conversion(source, convert) == folder and convert.count == 2 and folder_intact(folder)


@pytest.mark.parametrize("damage", ["truncate", "overwrite", "middle", "tokenizer middle", "delete", "no manifest"])
def test_a_damaged_folder_is_never_used_but_built_again(env, template, damage, caplog):
    source, convert = env
    folder = cached_conversion(source, convert)
    weights = folder / "model.safetensors"
    if damage == "truncate":
        with open(weights, "r+b") as fh:
            fh.truncate(weights.stat().st_size // 2)
    elif damage == "overwrite":
        with open(weights, "r+b") as fh:
            fh.write(b"\0" * 64)
    elif damage.endswith("middle"):  # past the first and last MiB of a large file
        damaged = folder / "tokenizer.json" if damage.startswith("tokenizer") else weights
        with open(damaged, "r+b") as fh:
            fh.seek(damaged.stat().st_size // 2)
            fh.write(b" ")
    else:
        (folder / ("tokenizer.json" if damage == "delete" else MANIFEST)).unlink()
    assert not folder_intact(folder)
    assert cached_conversion(source, convert) == folder and convert.count == 2
    assert folder_intact(folder) and "converting model.gguf again" in caplog.text
    torch.testing.assert_close(logits_of(folder), template[1], rtol=0, atol=0)


def test_an_interrupted_build_leaves_no_folder_and_is_cleaned_up(env):
    source, convert = env

    def dies(src, folder):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cached_conversion(source, dies)
    assert [p.name for p in cache_dir().iterdir()] == []
    folder = cached_conversion(source, convert)
    left = folder.with_name(folder.name + ".tmp999999")  # a killed process's temporary folder
    left.mkdir()
    (folder / MANIFEST).unlink()
    assert cached_conversion(source, convert) == folder and not left.exists()


def _build_in_process(args) -> str:
    source, template, calls = args
    folder = cached_conversion(Path(source), Converter(Path(template), Path(calls), pause=1.0))
    return str(folder)


def test_two_processes_building_at_once_both_get_the_one_good_folder(env, template):
    source, convert = env
    jobs = [(str(source), str(template[0]), str(convert.calls))] * 2
    with multiprocessing.get_context("fork").Pool(2) as pool:
        folders = pool.map(_build_in_process, jobs)
    assert folders[0] == folders[1] and convert.count == 1
    folder = Path(folders[0])
    assert folder_intact(folder) and sorted(p.name for p in cache_dir().iterdir()) == [folder.name]
    torch.testing.assert_close(logits_of(folder), template[1], rtol=0, atol=0)


def test_a_manifest_that_is_a_fifo_is_refused_at_once_and_the_folder_built_again(env):
    source, convert = env
    folder = cached_conversion(source, convert)
    (folder / MANIFEST).unlink()
    os.mkfifo(folder / MANIFEST)
    signal.alarm(60)  # a guard: a read that blocks would otherwise hang the suite
    try:
        assert not folder_intact(folder)
        assert cached_conversion(source, convert) == folder and convert.count == 2
    finally:
        signal.alarm(0)
    assert (folder / MANIFEST).is_file()


def _lock_of(source: Path) -> Path:
    target = cache._folder_for(source.resolve(), cache.file_digest(source.resolve()))
    target.parent.mkdir(parents=True, exist_ok=True)
    return target.with_name(target.name + ".lock")


def test_a_lock_left_by_another_host_is_refused_at_once_naming_the_file(env):
    source, convert = env
    lock = _lock_of(source)
    lock.write_text(json.dumps({"pid": 4242, "host": "some-other-host", "since": "2026-01-01 10:00:00"}))
    with pytest.raises(ModelLoadError, match=rf"another host, some-other-host.*delete the lock file {re.escape(str(lock))}"):
        cached_conversion(source, convert)
    assert convert.count == 0
    lock.unlink()
    assert folder_intact(cached_conversion(source, convert))


def test_a_build_held_by_this_host_is_waited_for_within_the_stated_limit(env, monkeypatch, caplog):
    source, convert = env
    monkeypatch.setenv(cache.WAIT_VAR, "0.5")
    with FileLock(_lock_of(source)):  # another holder, alive, that never finishes
        with pytest.raises(ModelLoadError, match=rf"for more than 0 s \({cache.WAIT_VAR} sets this limit\).*delete"):
            cached_conversion(source, convert)
    assert "waiting for it (at most 0 s" in caplog.text and convert.count == 0


@pytest.mark.parametrize("value", ["soon", "0", "-3", "inf"])
def test_a_wait_limit_that_is_not_a_positive_number_is_refused(monkeypatch, value):
    monkeypatch.setenv(cache.WAIT_VAR, value)
    with pytest.raises(LensprobeError, match=cache.WAIT_VAR):
        cache.wait_limit()


def test_a_large_file_damaged_past_its_first_and_last_mib_is_found(env, template):
    source, convert = env

    def with_large_file(src, folder):
        convert(src, folder)
        (folder / "large.bin").write_bytes(bytes(range(256)) * (5 << 12))  # 5 MiB

    folder = cached_conversion(source, with_large_file)
    large = folder / "large.bin"
    with open(large, "r+b") as fh:
        fh.seek(large.stat().st_size // 2)
        fh.write(b"\xff")
    assert not folder_intact(folder)
