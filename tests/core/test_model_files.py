"""Broken model files fail with a ModelLoadError naming the file: not GGUF, truncated (the header says how
long the file must be), or whole but unreadable by the loader."""

import struct

import pytest

import lensprobe as lp
from lensprobe.core.errors import ModelLoadError


def gguf_bytes(n_values: int = 64, *, kv: bytes = b"", n_kv: int = 0) -> bytes:
    """A whole GGUF (version 3) file: ``n_kv`` metadata entries, one float32 tensor of ``n_values`` values."""
    name = b"w"
    info = struct.pack("<Q", len(name)) + name + struct.pack("<IQIQ", 1, n_values, 0, 0)
    header = b"GGUF" + struct.pack("<IQQ", 3, 1, n_kv) + kv + info
    start = -(-len(header) // 32) * 32
    return header.ljust(start, b"\0") + struct.pack(f"<{n_values}f", *range(n_values))


def string_kv(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, len(v)) + v


def test_a_file_that_is_not_gguf_is_named(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(ModelLoadError, match=r"model.gguf is not a GGUF file \(it starts with b'PK\\x03\\x04'"):
        lp.load_model(path)


@pytest.mark.parametrize("keep,message", [
    (-1, r"is truncated: its header describes \d+ bytes but the file has \d+; download it again"),
    (20, "ends inside its header: the file is truncated or damaged"),
])
def test_a_truncated_gguf_file_is_named(tmp_path, keep, message):
    data = gguf_bytes(kv=string_kv("general.architecture", "no-such-architecture"), n_kv=1)
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:keep])
    with pytest.raises(ModelLoadError, match=rf"cut.gguf {message}"):
        lp.load_model(path)
    path.write_bytes(data)  # whole again: the size check passes (then the loader decides)
    with pytest.raises(ModelLoadError, match=r"cannot load the GGUF file .*cut.gguf: "):
        lp.load_model(path)


def test_an_unreadable_whole_gguf_file_is_named_not_blamed_on_json(tmp_path):
    path = tmp_path / "odd.gguf"
    path.write_bytes(gguf_bytes(kv=string_kv("general.architecture", "no-such-architecture"), n_kv=1))
    with pytest.raises(ModelLoadError, match=r"cannot load the GGUF file .*odd.gguf: \w+: .*re-download it, or pass "):
        lp.load_model(path)
    assert not list(lp.core.models.loading.cache_dir().glob("odd-*"))  # nothing half-converted left in the cache
