"""The one writer and deleter: every file lensprobe writes or removes goes through this module.

- :func:`atomic_file` is the one atomic write (a temporary file beside the target, ``fsync``,
  ``os.replace``): readers see the old file or the whole new one, never a part.
- :class:`OutputFolder` is a folder lensprobe writes into (a report, a command's ``--out``, a cache
  folder). Every name it is given is a path *relative to the folder*, checked before a byte is
  written or a file removed: an absolute path, a ``..``, or a path whose folder leads outside
  through a symbolic link is refused with a :class:`~lensprobe.core.errors.LensprobeError` naming
  the path and the fix. A name is written once per object: a second output of one run under the
  same name (two tables whose names give one file) is refused instead of overwriting the first.
- :func:`open_in` opens a file written in place (a row file, a lock file) inside its run folder,
  never through a link; :func:`probe_write` checks a folder can be written before any work.
- :func:`remove_file` and :func:`remove_tree` are the only deletions (a path that is not inside its
  stated folder is never removed).

``tests/test_code_shape.py`` fails when a module of the package outside this one calls a raw
write, rename or delete (the few that are not output files are listed there with their reason).

Example:
    >>> out = OutputFolder("runs/report")
    >>> out.write_text("sec/table.csv", "a,b\\n1,2\\n").name
    'table.csv'
    >>> out.write_text("sec/table.csv", "again")
    Traceback (most recent call last):
    lensprobe.core.errors.LensprobeError: runs/report/sec/table.csv is written twice by one run: ...
    >>> out.remove("../elsewhere.txt")
    Traceback (most recent call last):
    lensprobe.core.errors.LensprobeError: ../elsewhere.txt is outside the output folder runs/report: ...
"""

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from lensprobe.core.errors import LensprobeError

__all__ = ["OutputFolder", "atomic_file", "open_in", "probe_write", "remove_empty_folder", "remove_file", "remove_tree",
           "rename_into_place"]


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (same folder, same suffix) to write; on success it is
    fsynced and renamed to ``path`` with ``os.replace``. When the write raises, ``path`` is left as it
    was and the temporary file is removed.

    Example:
        >>> with atomic_file("out/table.csv") as tmp:
        ...     df.to_csv(tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _inside(folder: Path, path: Path) -> bool:
    """Whether ``path`` (its folder resolved, links followed) is inside ``folder``."""
    real = folder.resolve()
    return (path.parent.resolve() / path.name).is_relative_to(real) and path.name not in ("", "..")


def open_in(folder: str | os.PathLike, path: str | os.PathLike, flags: int) -> int:
    """A descriptor of ``path``, a file inside ``folder`` that lensprobe writes in place (a row file, a lock
    file), opened with ``flags`` (``os.O_CREAT`` creates it, mode 0644): its folder is resolved and must be
    inside ``folder``, and the file itself is never followed when it is a link (``O_NOFOLLOW``).

    Raises:
        LensprobeError: ``path`` is outside ``folder`` (through ``..`` or a linked folder) or is a link.
        OSError: what the operating system refused otherwise (the caller names the file and the fix).

    Example:
        >>> fd = open_in("runs/x", "runs/x/results-rank0.jsonl", os.O_RDWR | os.O_CREAT | os.O_APPEND)
    """
    path = Path(path)
    if not _inside(Path(folder), path):
        raise LensprobeError(f"{path} is outside the run folder {folder}: lensprobe writes only inside it; give a "
                             "path inside the folder.")
    try:
        return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as err:
        if path.is_symlink():
            raise LensprobeError(f"{path} is a symbolic link: lensprobe does not write through links (it could "
                                 "lead out of the run folder); delete the link and rerun.") from None
        raise err from None


def probe_write(folder: str | os.PathLike) -> None:
    """Create and delete a temporary file in ``folder``: permissions, read-only mounts and full quotas show
    here, before any work.

    Raises:
        OSError: the folder cannot be written to.
    """
    fd, probe = tempfile.mkstemp(prefix=".lensprobe-write-test-", dir=folder)
    os.close(fd)
    remove_file(folder, probe)


def remove_file(folder: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Delete the file ``path`` when it is inside ``folder`` (links in its folders followed); a link
    is removed, never what it points to. Returns whether a file was removed.

    Example:
        >>> remove_file("runs/x", "runs/x/.rank0.lock")
        True
    """
    path = Path(path)
    if not _inside(Path(folder), path) or not (path.is_file() or path.is_symlink()):
        return False
    path.unlink(missing_ok=True)
    return True


def remove_tree(folder: str | os.PathLike, path: str | os.PathLike) -> None:
    """Delete the folder ``path`` and all it holds, when it is inside ``folder`` and not a link."""
    path = Path(path)
    if _inside(Path(folder), path) and path.resolve() != Path(folder).resolve() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)


def remove_empty_folder(path: str | os.PathLike) -> bool:
    """Delete the folder ``path`` when it is empty and not a link; returns whether it was removed."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir() or any(path.iterdir()):
        return False
    path.rmdir()
    return True


def rename_into_place(folder: str | os.PathLike, src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Rename ``src`` to ``dst``, both inside ``folder`` (a finished temporary folder into its place)."""
    src, dst = Path(src), Path(dst)
    if not (_inside(Path(folder), src) and _inside(Path(folder), dst)):
        raise LensprobeError(f"refusing to rename {src} to {dst}: both must be inside {folder}.")
    src.rename(dst)


class OutputFolder:
    """A folder lensprobe writes into, with every path checked to stay inside it (module docstring).

    Args:
        root: the folder (created when missing).
        what: what it is, for messages (``"report folder"``).

    Example:
        >>> out = OutputFolder("runs/attn", what="output folder")
        >>> out.write_json("summary.json", {"n": 1}).name
        'summary.json'
    """

    def __init__(self, root: str | os.PathLike, *, what: str = "output folder") -> None:
        self.root = Path(root).expanduser()
        self.what = what
        self.root.mkdir(parents=True, exist_ok=True)
        self.written: list[str] = []

    def _refuse(self, rel: object, why: str) -> LensprobeError:
        return LensprobeError(f"{rel} is {why} the {self.what} {self.root}: lensprobe writes and deletes only "
                              f"inside it; give a path inside the folder (or fix the listing that names it).")

    def path(self, rel: str | os.PathLike) -> Path:
        """``root / rel``, checked: relative, no ``..``, and no link leading outside the folder.

        Raises:
            LensprobeError: the path is absolute, climbs out with ``..``, or leaves through a link.
        """
        if not isinstance(rel, str | os.PathLike) or not str(rel) or "\x00" in str(rel):
            raise self._refuse(repr(rel), "not a file name in")
        parts = PurePosixPath(Path(rel).as_posix())
        if parts.is_absolute() or Path(rel).is_absolute():
            raise self._refuse(rel, "an absolute path, not a name in")
        if ".." in parts.parts or not parts.parts or parts.name in ("", "."):
            raise self._refuse(rel, "outside")
        full = self.root / parts
        if not _inside(self.root, full):
            raise self._refuse(rel, "(through a symbolic link) outside")
        return full

    def claim(self, rel: str | os.PathLike) -> Path:
        """The checked path of an output this run writes; a second claim of one name is refused."""
        full = self.path(rel)
        name = full.relative_to(self.root).as_posix()
        if name in self.written:
            raise LensprobeError(f"{full} is written twice by one run: two outputs have the same name and the "
                                 "second would overwrite the first; give them different names.")
        self.written.append(name)
        return full

    @contextlib.contextmanager
    def atomic(self, rel: str | os.PathLike) -> Iterator[Path]:
        """:func:`atomic_file` on the claimed ``rel``; the error of a failed write names the file."""
        full = self.claim(rel)
        try:
            with atomic_file(full) as tmp:
                yield tmp
        except OSError as err:
            raise LensprobeError(f"could not write {full}: {err.strerror or err}; free space on its disk (or "
                                 "write to another folder) and rerun.") from err

    def write_with(self, rel: str | os.PathLike, write: Callable[[Path], object]) -> Path:
        """Write ``rel`` atomically: ``write(tmp)`` fills a temporary file; returns the path."""
        with self.atomic(rel) as tmp:
            write(tmp)
        return self.root / rel

    def write_bytes(self, rel: str | os.PathLike, data: bytes) -> Path:
        """Write ``data`` to ``rel`` atomically; returns the path."""
        return self.write_with(rel, lambda tmp: tmp.write_bytes(data))

    def write_text(self, rel: str | os.PathLike, text: str) -> Path:
        """Write ``text`` (UTF-8) to ``rel`` atomically; returns the path."""
        return self.write_with(rel, lambda tmp: tmp.write_text(text, encoding="utf-8"))

    def write_json(self, rel: str | os.PathLike, data: Any, *, indent: int = 1) -> Path:
        """Write ``data`` as JSON to ``rel`` atomically; returns the path."""
        return self.write_text(rel, json.dumps(data, indent=indent) + "\n")

    def check_all(self, names: list[str]) -> list[Path]:
        """The checked paths of ``names`` (e.g. from a listing file), all checked before any is used."""
        return [self.path(rel) for rel in names]

    def remove(self, rel: str | os.PathLike) -> bool:
        """Delete the file ``rel`` (checked like :meth:`path`); returns whether one was removed."""
        return remove_file(self.root, self.path(rel))

    def remove_empty_dir(self, rel: str | os.PathLike) -> None:
        """Delete the folder ``rel`` when it is empty (and a real folder inside, not a link)."""
        full = self.path(rel)
        if full.is_dir() and not full.is_symlink() and not any(full.iterdir()):
            full.rmdir()
