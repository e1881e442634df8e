"""Checking a GGUF model file before transformers reads it: the magic bytes, the header (versions 2
and 3) and that the file reaches the end of its last tensor's data (a truncated download is named).

Example:
    >>> check_gguf(Path("model.gguf"))  # raises ModelLoadError for a damaged or truncated file
"""

import importlib
import math
import os
import struct
from pathlib import Path

from lensprobe.core.errors import ModelLoadError

__all__ = ["check_gguf"]


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
"""GGUF metadata value types of fixed size -> their ``struct`` format (8 is a string, 9 an array)."""


class _GGUFHeader:
    """Reads the header of a GGUF file (little-endian, versions 2 and 3) from a binary file object."""

    def __init__(self, fh) -> None:
        self.fh = fh

    def take(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        data = self.fh.read(size)
        if len(data) < size:
            raise EOFError
        return struct.unpack("<" + fmt, data)[0]

    def string(self) -> bytes:
        n = self.take("Q")
        if n > 1 << 24:
            raise ValueError(f"a string of {n} bytes")
        data = self.fh.read(n)
        if len(data) < n:
            raise EOFError
        return data

    def value(self, kind: int):
        if kind in _GGUF_SCALARS:
            return self.take(_GGUF_SCALARS[kind])
        if kind == 8:
            return self.string()
        if kind == 9:
            item, count = self.take("I"), self.take("Q")
            if item in _GGUF_SCALARS:  # skip fixed-size items at once
                size = struct.calcsize("<" + _GGUF_SCALARS[item]) * count
                self.fh.seek(size, os.SEEK_CUR)
                return None
            for _ in range(count):
                self.value(item)
            return None
        raise ValueError(f"unknown metadata type {kind}")


def _gguf_quant_sizes() -> dict:
    """GGML type -> (elements per block, bytes per block), from the ``gguf`` package transformers
    reads GGUF files with; empty without it (then only the tensors' offsets are checked)."""
    try:
        constants = importlib.import_module("gguf.constants")
    except ImportError:  # pragma: no cover - transformers needs gguf to read GGUF files
        return {}
    return {int(k): v for k, v in constants.GGML_QUANT_SIZES.items()}


def check_gguf(gguf: Path) -> None:
    """Refuse a file that is not GGUF (magic bytes) or is shorter than its header says.

    The header lists every tensor's offset, shape and type; the file must reach the end of the
    last tensor's data.
    """
    size = gguf.stat().st_size
    with open(gguf, "rb") as fh:
        magic = fh.read(4)
        if magic != b"GGUF":
            raise ModelLoadError(
                f"{gguf} is not a GGUF file (it starts with {magic!r}, not b'GGUF'): pass a .gguf model file, "
                "a Hugging Face model folder or a hub name."
            )
        head = _GGUFHeader(fh)
        try:
            version = head.take("I")
            if version not in (2, 3):
                raise ModelLoadError(f"{gguf} is GGUF version {version}; lensprobe reads versions 2 and 3: "
                                     "convert it with a recent llama.cpp.")
            n_tensors, n_kv = head.take("Q"), head.take("Q")
            alignment = 32
            for _ in range(n_kv):
                key, kind = head.string(), head.take("I")
                value = head.value(kind)
                if key == b"general.alignment" and isinstance(value, int) and value > 0:
                    alignment = value
            end = 0
            quant_sizes = _gguf_quant_sizes()
            for _ in range(n_tensors):
                head.string()
                dims = [head.take("Q") for _ in range(head.take("I"))]
                kind, offset = head.take("I"), head.take("Q")
                block, block_bytes = quant_sizes.get(kind, (1, 0))
                end = max(end, offset + math.prod(dims) // block * block_bytes)
            data_start = -(-fh.tell() // alignment) * alignment
        except ModelLoadError:
            raise
        except (EOFError, ValueError, struct.error) as err:
            why = "ends inside its header" if isinstance(err, EOFError) else f"has a damaged header ({err})"
            raise ModelLoadError(f"{gguf} {why}: the file is truncated or damaged; download it again.") from None
    if size < data_start + end:
        raise ModelLoadError(
            f"{gguf} is truncated: its header describes {data_start + end} bytes but the file has {size}; "
            "download it again."
        )
