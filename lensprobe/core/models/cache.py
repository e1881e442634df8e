"""The converted-model cache: a GGUF file converted once into a safetensors folder (config, tokenizer,
``model.safetensors``) that later loads read memory-mapped, with no conversion.

- **Where**: :func:`cache_dir`: ``$LENSPROBE_CACHE`` if set, else ``$XDG_CACHE_HOME/lensprobe``
  (default ``~/.cache/lensprobe``).
- **Key**: a folder is named by the file's stem and a digest of the file's content and of the versions
  that shape the conversion (:data:`CONVERSION_VERSION`, transformers, tokenizers, torch, gguf,
  safetensors: :func:`conversion_versions`). A changed file or version names another folder, which is
  built anew; the same file installed twice (two environments) shares one folder.
- **Whole-file digests, checked once per process**: the GGUF file and every file of a folder are
  hashed whole (SHA-256, through the checked reader :func:`~lensprobe.core.storage.files.file_sha256`,
  so a FIFO or a device in the cache is refused at once) before their first use in a process; a
  digest is remembered only in this process, by the file's path, device, inode, size, modification
  and change times (and forgotten when its folder is rebuilt), never on disk (a remembered digest cannot go stale across processes).
  Measured: SHA-256 hashes about 0.15 to 0.2 s per 100 MB (the embedded model: 0.19 s for its 98 MB
  GGUF file, 1.0 s for its 538 MB ``model.safetensors``; BLAKE2b was slower, 0.23 s per 100 MB).
- **Checked before use**: ``manifest.json``, written last, lists every file's size and SHA-256. A
  folder whose files differ (truncated, damaged in the middle, partly deleted, overwritten) is never
  used: it is built again, with a warning (logger ``lensprobe.core.models.cache``).
- **One builder**: a process builds a folder while holding a lock beside it
  (:class:`~lensprobe.core.storage.locks.FileLock`); another process of this host wanting the same folder
  says so (a warning) and waits for it, at most :func:`wait_limit` seconds, then uses its folder. A lock
  held by a process of another host cannot be checked from here: it is refused at once, naming the
  lock file and its holder (delete the file once that process is gone). A build writes into a temporary folder renamed into place, so an interrupted
  build leaves no folder behind (the next builder deletes its temporary folder).

Example:
    >>> folder = cached_conversion(Path("model.gguf"), convert)  # convert(gguf, folder) writes the folder
    >>> sorted(p.name for p in folder.iterdir())[:2]
    ['config.json', 'manifest.json']
"""

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from lensprobe.core.errors import LensprobeError, ModelLoadError
from lensprobe.core.given import seconds_from_env
from lensprobe.core.storage.files import file_sha256, read_text
from lensprobe.core.storage.jsonable import json_digest
from lensprobe.core.storage.locks import FileLock, lock_holder
from lensprobe.core.storage.nesting import parse_json
from lensprobe.core.storage.store import atomic_write_json
from lensprobe.core.storage.writer import remove_tree, rename_into_place

__all__ = ["CONVERSION_VERSION", "MANIFEST", "WAIT_SECONDS", "WAIT_VAR", "cache_dir", "cached_conversion",
           "conversion_versions", "file_digest", "folder_intact", "wait_limit"]

logger = logging.getLogger(__name__)
"""Reports a damaged cache folder being built again (a warning)."""

CONVERSION_VERSION = 2
"""lensprobe's version of the conversion: raise it when the converted folder's content changes."""
MANIFEST = "manifest.json"
VERSIONED = ("transformers", "tokenizers", "torch", "gguf", "safetensors")
"""The packages whose versions shape a converted folder (part of its key)."""
MANIFEST_FORMAT = 2
"""2: whole-file digests (1 hashed only the first and last MiB of a large file: such a folder is built again)."""
FILE_LIMIT = 1 << 40
"""The largest cache or GGUF file read (1 TiB)."""
WAIT_SECONDS = 3600.0
"""How long a process waits for another one of this host converting the same file before giving up,
unless the environment variable :data:`WAIT_VAR` sets another number (:func:`wait_limit`)."""
WAIT_VAR = "LENSPROBE_CACHE_WAIT"
_DIGESTS: dict[tuple, str] = {}


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


def _stat_key(path: Path) -> tuple:
    st = os.stat(path)
    return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _forget(folder: Path) -> None:
    """Drop the digests remembered for files of ``folder`` (rebuilt: a new file may reuse an inode)."""
    for key in [k for k in _DIGESTS if Path(k[0]).parent == folder]:
        del _DIGESTS[key]


def file_digest(path: Path, *, what: str = "model cache file") -> str:
    """SHA-256 (hex) of the whole of ``path``, read through the checked reader
    (:func:`~lensprobe.core.storage.files.file_sha256`: a FIFO or a device is refused at once). Remembered
    in this process only, by the file's path, device, inode, size, modification and change times.

    Example:
        >>> len(file_digest(Path("model.gguf")))
        64
    """
    path = Path(path)
    try:
        key = _stat_key(path)
    except OSError:
        key = None
    if key is not None and key in _DIGESTS:
        return _DIGESTS[key]
    content = file_sha256(path, what, FILE_LIMIT)
    with contextlib.suppress(OSError):
        if key is not None and _stat_key(path) == key:  # unchanged while it was read
            _DIGESTS[key] = content
    return content


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
        manifest = parse_json(read_text(folder / MANIFEST, "model cache manifest"), "model cache manifest")
        files = manifest["files"]
        return bool(files) and manifest.get("format") == MANIFEST_FORMAT and all(
            (folder / name).stat().st_size == entry["size"] and file_digest(folder / name) == entry["sha256"]
            for name, entry in files.items()
        )
    except (OSError, LensprobeError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _write_manifest(folder: Path, about: dict[str, Any]) -> None:
    files = {p.name: {"size": p.stat().st_size, "sha256": file_digest(p)}
             for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    if not files:
        raise ModelLoadError(f"the conversion wrote no file into {folder}: check the cache folder's disk space.")
    atomic_write_json(folder / MANIFEST, {"format": MANIFEST_FORMAT, **about, "files": files})


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
    content = file_digest(source, what="GGUF file")
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


def wait_limit() -> float:
    """Seconds to wait for another process converting the same file: ``$LENSPROBE_CACHE_WAIT`` when it
    is a positive number, else :data:`WAIT_SECONDS`.

    Example:
        >>> wait_limit()
        3600.0
    """
    return seconds_from_env(WAIT_VAR, WAIT_SECONDS, "waiting for another process converting the same model")


def _stuck(lock: FileLock, target: Path, why: str) -> ModelLoadError:
    return ModelLoadError(f"{target} is being built by {why}; if no such process is converting it, delete the "
                          f"lock file {lock.path} and load again.")


def _wait_for(lock: FileLock, target: Path) -> bool:
    """Take ``lock`` (False), or find ``target`` built by its holder meanwhile (True); a holder of
    another host is refused at once, a holder of this host waited for at most :func:`wait_limit` s."""
    limit = wait_limit()
    deadline, told = time.monotonic() + limit, False
    while True:
        try:
            lock.acquire()
            return False
        except LensprobeError:
            if folder_intact(target):
                return True
            holder = lock_holder(lock.path) or {}
            if holder.get("host") not in (None, socket.gethostname()):
                raise _stuck(lock, target, f"pid {holder.get('pid')} on another host, {holder.get('host')}, "
                             "which cannot be checked from here") from None
            if time.monotonic() > deadline:
                raise _stuck(lock, target, f"pid {holder.get('pid')} for more than {limit:.0f} s ({WAIT_VAR} "
                             "sets this limit)") from None
            if not told:
                logger.warning("%s is being converted by pid %s: waiting for it (at most %.0f s; %s sets the "
                               "limit).", target.name, holder.get("pid"), limit, WAIT_VAR)
                told = True
            time.sleep(0.2)


def _build(source: Path, target: Path, convert: Callable[[Path, Path], None], about: dict[str, Any]) -> None:
    """Convert ``source`` into a temporary folder, list its files in the manifest, rename it to ``target``."""
    root = target.parent
    for left in root.glob(f"{target.name}.tmp*"):  # from an interrupted build: ours now (we hold the lock)
        remove_tree(root, left)
    if target.exists():
        logger.warning("%s is damaged, incomplete or checked in part only (a file is missing or differs from "
                       "its manifest, or an earlier lensprobe wrote it): converting %s again.", target, source.name)
        old = target.with_name(f"{target.name}.tmp-old{os.getpid()}")
        rename_into_place(root, target, old)
        remove_tree(root, old)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    _forget(target)
    try:
        convert(source, tmp)
        _write_manifest(tmp, about)
        rename_into_place(root, tmp, target)
    finally:
        remove_tree(root, tmp)
