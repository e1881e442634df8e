"""The converted-model cache: a GGUF file converted once into a safetensors folder (config, tokenizer,
``model.safetensors``) that later loads read memory-mapped, with no conversion.

- **Where**: :func:`cache_dir`: ``$LENSPROBE_CACHE`` if set, else ``$XDG_CACHE_HOME/lensprobe``
  (default ``~/.cache/lensprobe``).
- **Key**: a folder is named by the file's stem and a digest of the file's content and of the versions
  that shape the conversion (:data:`CONVERSION_VERSION`, transformers, tokenizers, torch, gguf,
  safetensors: :func:`conversion_versions`). A changed file or version names another folder, which is
  built anew; the same file installed twice (two environments) shares one folder.
- **A cheap key**: hashing the whole file costs about 0.25 s per 100 MB, so its digest is remembered in
  ``digests/`` by the file's path, size and modification time, and a load only reads that. The
  remembered digest only finds a folder: a folder is built from a digest computed from the file then.
- **Checked before use**: ``manifest.json``, written last, lists every file's size and a SHA-256 (of the
  whole of a small file; of the first and last MiB of a large one, so checking costs milliseconds). A
  folder whose files differ (truncated, partly deleted, overwritten) is never used: it is built again,
  with a warning (logger ``lensprobe.core.models.cache``).
- **One builder**: a process builds a folder while holding a lock beside it
  (:class:`~lensprobe.core.storage.locks.FileLock`); another process wanting the same folder waits for it
  and then uses its folder. A build writes into a temporary folder renamed into place, so an interrupted
  build leaves no folder behind (the next builder deletes its temporary folder).

Example:
    >>> folder = cached_conversion(Path("model.gguf"), convert)  # convert(gguf, folder) writes the folder
    >>> sorted(p.name for p in folder.iterdir())[:2]
    ['config.json', 'manifest.json']
"""

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from lensprobe.core.errors import LensprobeError, ModelLoadError
from lensprobe.core.storage.jsonable import digest, json_digest
from lensprobe.core.storage.locks import FileLock
from lensprobe.core.storage.store import atomic_write_json, atomic_write_text

__all__ = ["CONVERSION_VERSION", "MANIFEST", "cache_dir", "cached_conversion", "conversion_versions",
           "file_digest", "folder_intact"]

logger = logging.getLogger(__name__)
"""Reports a damaged cache folder being built again (a warning)."""

CONVERSION_VERSION = 2
"""lensprobe's version of the conversion: raise it when the converted folder's content changes."""
MANIFEST = "manifest.json"
VERSIONED = ("transformers", "tokenizers", "torch", "gguf", "safetensors")
"""The packages whose versions shape a converted folder (part of its key)."""
SAMPLE = 1 << 20
"""A file larger than twice this is checked by its first and last ``SAMPLE`` bytes (and its size)."""
WAIT_SECONDS = 3600.0
"""How long a process waits for another one converting the same file before giving up."""
_CHUNK = 1 << 22


def cache_dir() -> Path:
    """Folder where converted models are cached.

    ``$LENSPROBE_CACHE`` if set, else ``$XDG_CACHE_HOME/lensprobe`` (default
    ``~/.cache/lensprobe``).

    Example:
        >>> cache_dir()
        PosixPath('/home/me/.cache/lensprobe')
    """
    env = os.environ.get("LENSPROBE_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lensprobe"


def conversion_versions() -> dict[str, str]:
    """The versions that shape a converted folder: lensprobe's conversion and the packages that do it.

    Example:
        >>> conversion_versions()["lensprobe-conversion"]
        '2'
    """
    out = {"lensprobe-conversion": str(CONVERSION_VERSION)}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def file_digest(path: Path, *, sample: bool = False) -> str:
    """SHA-256 of a file's bytes (hex); with ``sample``, of its first and last :data:`SAMPLE` bytes and
    its size when it is larger than twice that.

    Example:
        >>> len(file_digest(Path("model.gguf")))
        64
    """
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if sample and size > 2 * SAMPLE:
            h.update(f"{size}:".encode())
            h.update(fh.read(SAMPLE))
            fh.seek(size - SAMPLE)
            h.update(fh.read(SAMPLE))
            return h.hexdigest()
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _stat_key(path: Path) -> str:
    st = path.stat()
    return digest(f"{path}|{st.st_size}|{st.st_mtime_ns}", length=32)


def _remembered_digest(path: Path) -> str | None:
    """The content digest remembered for ``path`` as it is now (same size and modification time)."""
    try:
        text = (cache_dir() / "digests" / _stat_key(path)).read_text().strip()
    except OSError:
        return None
    return text if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else None


def _remember_digest(path: Path, content: str) -> None:
    """Remember ``content`` for ``path`` as it is now; where the cache cannot be written (a read-only
    cache a folder was put in by hand), the next load hashes the file again."""
    folder = cache_dir() / "digests"
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / _stat_key(path), content + "\n")


def _folder_for(source: Path, content: str) -> Path:
    key = json_digest({"source": content, "versions": conversion_versions()}, length=12)
    return cache_dir() / f"{source.stem}-{key}"


def folder_intact(folder: Path) -> bool:
    """Whether ``folder`` holds a complete conversion: its manifest lists every file with the size and
    digest it has now.

    Example:
        >>> folder_intact(cache_dir() / "SmolLM2-135M-Instruct.Q4_1-0123456789ab")
        True
    """
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        return bool(files) and manifest.get("format") == 1 and all(
            (folder / name).stat().st_size == entry["size"]
            and file_digest(folder / name, sample=True) == entry["sha256"]
            for name, entry in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _write_manifest(folder: Path, about: dict[str, Any]) -> None:
    files = {p.name: {"size": p.stat().st_size, "sha256": file_digest(p, sample=True)}
             for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    if not files:
        raise ModelLoadError(f"the conversion wrote no file into {folder}: check the cache folder's disk space.")
    atomic_write_json(folder / MANIFEST, {"format": 1, **about, "files": files})


def cached_conversion(source: Path, convert: Callable[[Path, Path], None]) -> Path:
    """The cached conversion of ``source``: its folder in :func:`cache_dir`, built by
    ``convert(source, folder)`` when missing or damaged (see the module docstring).

    Raises:
        ModelLoadError: ``source`` is not a file, or another process kept converting it for
            :data:`WAIT_SECONDS`.

    Example:
        >>> cached_conversion(Path("model.gguf"), convert).name
        'model-0123456789ab'
    """
    source = Path(source).resolve()
    if not source.is_file():
        raise ModelLoadError(f"GGUF file not found: {source}. Check the path.")
    known = _remembered_digest(source)
    if known is not None and folder_intact(target := _folder_for(source, known)):
        return target
    content = file_digest(source)
    _remember_digest(source, content)
    target = _folder_for(source, content)
    if folder_intact(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(target.with_name(target.name + ".lock"))
    if _wait_for(lock, target):
        return target
    try:
        if not folder_intact(target):
            _build(source, target, convert, {"source": {"name": source.name, "sha256": content},
                                             "versions": conversion_versions()})
    finally:
        lock.release()
    return target


def _wait_for(lock: FileLock, target: Path) -> bool:
    """Take ``lock`` (False), or find ``target`` built by its holder meanwhile (True)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            lock.acquire()
            return False
        except LensprobeError as err:
            if folder_intact(target):
                return True
            if time.monotonic() > deadline:
                raise ModelLoadError(
                    f"{target} has been built by another process for {WAIT_SECONDS:.0f} s ({err}); "
                    f"if no process is converting it, delete {lock.path} and load again."
                ) from None
            time.sleep(0.5)


def _build(source: Path, target: Path, convert: Callable[[Path, Path], None], about: dict[str, Any]) -> None:
    """Convert ``source`` into a temporary folder, list its files in the manifest, rename it to ``target``."""
    for left in target.parent.glob(f"{target.name}.tmp*"):  # from an interrupted build: ours now (we hold the lock)
        shutil.rmtree(left, ignore_errors=True)
    if target.exists():
        logger.warning("%s is damaged or incomplete (a file is missing or differs from its manifest): "
                       "converting %s again.", target, source.name)
        old = target.with_name(f"{target.name}.tmp-old{os.getpid()}")
        target.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    try:
        convert(source, tmp)
        _write_manifest(tmp, about)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
