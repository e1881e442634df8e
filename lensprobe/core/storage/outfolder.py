"""An output folder of the results store: its lock, and the files its latest run wrote.

A run that writes files into a folder (a command's tables, figures, traces and summaries)
holds the folder's lock while it runs (:func:`lock_folder`, a
:class:`~lensprobe.core.storage.locks.FileLock` on ``.lensprobe.lock``): a second run into the same
folder is refused at once with a :class:`~lensprobe.core.errors.LensprobeError` naming the
folder, the holder and the fix (wait for the first run to finish, or use another folder). It
does not wait: a run that waits for minutes without saying why looks hung.

Every file is written whole (:func:`~lensprobe.core.storage.store.atomic_file`). When a run ends it
lists the files it wrote in :data:`PAGES_FILE` (:func:`replace_pages`) and deletes the files
the folder's earlier run listed and this run did not write again, so a rerun with other
settings leaves no page of the earlier run behind (every listed path is checked to be inside the
folder first, :class:`~lensprobe.core.storage.writer.OutputFolder`: a listing naming ``..``, an absolute
path or a link leading out is refused before anything is deleted) (a run that stops early deletes nothing:
its files are listed, and cleared, by the next run that ends). Result files kept by the store
(``config.json``, rows and shard files) are never listed: a run with other
settings is refused on them instead.

Example:
    >>> with lock_folder("runs/sweep", "lensprobe sweep"):
    ...     files = [atomic_write_json("runs/sweep/sweep.json", {"v": 1})]
    ...     replace_pages("runs/sweep", "lensprobe sweep", files)
    []
"""

import os
from collections.abc import Iterable
from pathlib import Path

from lensprobe.core.errors import LensprobeError
from lensprobe.core.storage.locks import FileLock
from lensprobe.core.storage.store import atomic_write_json, open_folder, read_json
from lensprobe.core.storage.writer import OutputFolder

__all__ = ["FOLDER_LOCK", "PAGES_FILE", "lock_folder", "replace_pages"]

FOLDER_LOCK = ".lensprobe.lock"
"""The lock file of an output folder."""
PAGES_FILE = ".lensprobe-files.json"
"""The files the folder's latest finished run wrote (relative paths), and what wrote them."""


def lock_folder(out: str | os.PathLike, what: str) -> FileLock:
    """Take the lock of the output folder ``out`` (created if missing) for a run of ``what``.

    Returns:
        The held lock; release it (or use it as a context manager) when the run has written
        its files.

    Raises:
        LensprobeError: another run holds the folder; names it and says what to do.

    Example:
        >>> with lock_folder("runs/sweep", "lensprobe sweep"):
        ...     pass
    """
    folder = open_folder(out)
    name = str(folder).replace("{", "{{").replace("}", "}}")
    return FileLock(folder / FOLDER_LOCK, busy=(
        f"{name} is being written by another run ({{holder}}), so this {what} would mix its files with that "
        "run's: wait for it to finish, or give this run another output folder (--out).")).acquire()


def _listed(folder: OutputFolder, listing: Path, keep: list[str]) -> list[str]:
    """The files the earlier run listed that this run did not write, every one checked to be inside the
    folder before any is deleted (the listing may have been edited)."""
    old = read_json(listing, fix="delete it").get("files", []) if listing.is_file() else []
    names = [rel for rel in old if isinstance(rel, str) and rel not in keep and rel != PAGES_FILE]
    try:
        folder.check_all(names)
    except LensprobeError as err:
        raise LensprobeError(f"{listing} lists a file outside its folder ({err}) Nothing was deleted: delete "
                             f"{listing.name} and rerun.") from None
    return names


def _relative(folder: OutputFolder, file: str | os.PathLike) -> str:
    """``file`` (a path this run wrote) relative to ``folder``; one outside it is refused."""
    path, root = Path(file).resolve(), folder.root.resolve()
    if not path.is_relative_to(root):
        raise LensprobeError(f"{file} was written outside the output folder {folder.root}: lensprobe writes only "
                             "inside it; this is a bug in the command that wrote it.")
    return path.relative_to(root).as_posix()


def replace_pages(out: str | os.PathLike, what: str, files: Iterable[str | os.PathLike]) -> list[Path]:
    """List ``files`` as the pages of the folder's latest run and delete the pages the earlier
    run listed that are not among them.

    Args:
        out: the output folder.
        what: what wrote the files (e.g. ``"lensprobe sweep"``), recorded in the listing.
        files: every file this run wrote into ``out`` (paths inside it).

    Returns:
        The files of the earlier run that were deleted.

    Raises:
        LensprobeError: two of ``files`` are one file (two outputs of one run on one name: the second
            overwrote the first), one is outside ``out``, or the earlier listing names a path outside it.

    Example:
        >>> replace_pages("runs/attn", "lensprobe attention", ["runs/attn/attention_received_L1.html"])
        [PosixPath('runs/attn/attention_received_L0.html')]
    """
    folder = OutputFolder(out)
    listing = folder.root / PAGES_FILE
    new = sorted(folder.claim(_relative(folder, f)).relative_to(folder.root).as_posix() for f in files)
    removed = [folder.root / rel for rel in _listed(folder, listing, new) if folder.remove(rel)]
    atomic_write_json(listing, {"written_by": what, "files": new})
    return removed
