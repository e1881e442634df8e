"""Row files of the results store: append-only JSON Lines that survive crashes, one per process.

A run that produces rows (an evaluation: one row per condition, problem and sample; a sharded
run of :class:`~lensprobe.core.storage.shards.ShardStore`: one row per finished unit) gives each
process its own file (``results-rank{R}.jsonl``, ``shard-rank{R}.jsonl``), written by a
:class:`RowWriter`: one ``os.write`` per row, ``fsync`` when its writer syncs (an evaluation
after each batch, a sharded run after each row), a lock while open, a row cut short by a crash
removed before new rows are appended. :func:`read_row_files` merges every rank's file, row by
row, skipping a last line without its newline (cut short by a crash). Every line carries
:data:`ROW_DIGEST`, the digest of its row's canonical JSON (:func:`row_line`), checked on every read:
a row edited by hand or damaged in the middle of the file is refused with its file and line, and a
line without one (an older lensprobe's file) is refused with what to do. The rest of the store
(atomic writes, settings, the wait) is :mod:`lensprobe.core.storage.store`.

Example:
    >>> with RowWriter(Path("runs/x/results-rank0.jsonl")) as writer:
    ...     writer.write({"problem_id": "q0"})
    >>> [row for _, _, row in read_row_files(Path("runs/x"), "results-rank*.jsonl")]
    [{'problem_id': 'q0'}]
"""

import contextlib
import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lensprobe.core.errors import LensprobeError
from lensprobe.core.storage.files import DATA_LIMIT, read_bytes
from lensprobe.core.storage.jsonable import json_digest
from lensprobe.core.storage.locks import FileLock
from lensprobe.core.storage.nesting import parse_json
from lensprobe.core.storage.writer import open_in

__all__ = ["ROW_DIGEST", "RowWriter", "read_row_file", "read_row_files", "row_line"]


ROW_DIGEST = "row_digest"
"""The field of every line that holds the digest of the line's own row (:func:`row_line`)."""


def row_line(row: dict[str, Any]) -> str:
    """The line a row is written as: its JSON with :data:`ROW_DIGEST`, the digest of the row's canonical
    JSON (sorted keys), which :func:`read_row_file` checks, so a row edited by hand or damaged is named.

    Example:
        >>> row_line({"unit": "a", "result": 1})
        '{"unit": "a", "result": 1, "row_digest": "..."}\n'
    """
    row = json.loads(json.dumps(row))  # as it reads back (tuples become lists): what the digest covers
    return json.dumps({**row, ROW_DIGEST: json_digest(row)}, ensure_ascii=False) + "\n"


def _checked_row(value: Any, path: Path, line_no: int) -> dict[str, Any]:
    """The row of one line, its digest checked and removed."""
    if not isinstance(value, dict) or ROW_DIGEST not in value:
        raise LensprobeError(f"{path} line {line_no} has no {ROW_DIGEST}: it was written by an older lensprobe (or "
                             "by hand), so its content cannot be checked. Rerun into a new output folder (or delete "
                             "this one to start over).")
    row = {k: v for k, v in value.items() if k != ROW_DIGEST}
    if json_digest(row) != value[ROW_DIGEST]:
        raise LensprobeError(f"{path} line {line_no} does not match its {ROW_DIGEST}: the row was edited or damaged "
                             "since it was written; delete that line to compute its row again.")
    return row


def read_row_file(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, row)`` for every complete line of a row file (a last line without its
    newline was cut short by a crash: it is skipped), each line's digest checked (:func:`row_line`)
    and removed from the row.

    Raises:
        LensprobeError: a complete line is not valid JSON, lacks its digest (an older lensprobe's
            file) or does not match it (the file was edited or damaged), or the path is not a
            regular file of at most :data:`~lensprobe.core.storage.files.DATA_LIMIT` bytes.

    Example:
        >>> list(read_row_file(Path("runs/x/results-rank0.jsonl")))
        [(1, {'problem_id': 'q0'})]
    """
    data = read_bytes(path, "row file", DATA_LIMIT)
    if not data:
        return
    lines = data.split(b"\n")
    # The last piece is b"" when the file ends with a newline, else a row cut off by a crash.
    for line_no, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        try:
            row = parse_json(line, f"results file {path} line {line_no}")
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            why = err.msg if isinstance(err, json.JSONDecodeError) else "bytes that are not UTF-8"
            raise LensprobeError(
                f"{path} line {line_no} is not valid JSON ({why}); the file was edited or damaged: "
                "delete that line to rerun the row."
            ) from None
        yield line_no, _checked_row(row, path, line_no)


def read_row_files(folder: Path, pattern: str) -> Iterator[tuple[Path, int, Any]]:
    """``(file, line number, row)`` for every complete row of every file of ``folder`` matching
    ``pattern`` (the ranks' files merged, in file-name order).

    Example:
        >>> [row["rank"] for _, _, row in read_row_files(Path("runs/x"), "results-rank*.jsonl")]
        [0, 0, 1]
    """
    for path in sorted(Path(folder).glob(pattern)):
        for line_no, row in read_row_file(path):
            yield path, line_no, row


class RowWriter:
    """Appends rows to one results file: one ``os.write`` per row, ``fsync`` on :meth:`sync`.

    Holds a :class:`~lensprobe.core.storage.locks.FileLock` beside the file (``.results-rank{R}.jsonl.lock``),
    so two processes never write the same file (run sharded processes with distinct ranks); a
    lock left by a killed process is taken over with a warning. A caller that already holds a
    lock covering the file (a :class:`~lensprobe.core.storage.shards.ShardStore`'s rank lock)
    passes ``locked=True``, and the writer takes no lock of its own. A failed write or ``fsync``
    (a full disk, a lost network mount) raises at once, saying how many rows are safely on
    disk; a row cut short by a failed write is removed.

    Attributes:
        written: rows written by this writer (handed to the operating system).
        synced: rows of this writer known to be on disk (fsynced).
    """

    @staticmethod
    def lock_file(path: Path) -> Path:
        """The lock file beside the results file ``path``."""
        return Path(path).with_name(f".{Path(path).name}.lock")

    def __init__(self, path: Path, *, locked: bool = False) -> None:
        self.path = Path(path)
        self._lock: FileLock | None = None
        if not locked:
            self._lock = FileLock(
                self.lock_file(self.path),
                busy=f"{self.path} is being written by another process ({{holder}}): wait for it, or give this "
                     "run another output folder (sharded runs need distinct ranks).")
            self._lock.acquire()
        try:
            self._fd: int | None = open_in(self.path.parent, self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        except LensprobeError:
            self._release_lock()
            raise
        except OSError as err:
            self._release_lock()
            raise LensprobeError(f"cannot open {self.path} for writing ({err.strerror}): choose an output folder "
                                 "you can write to.") from None
        self.written = self.synced = 0
        self._failed = False
        try:
            self._size = self._drop_partial_tail()
        except BaseException:
            self._close_fd()
            raise

    def _drop_partial_tail(self) -> int:
        size = os.fstat(self._open_fd).st_size
        if size == 0:
            return size
        os.lseek(self._open_fd, size - 1, os.SEEK_SET)  # appends still go to the end (O_APPEND)
        if os.read(self._open_fd, 1) == b"\n":
            return size
        os.lseek(self._open_fd, 0, os.SEEK_SET)
        data = b""
        while len(data) < size:
            chunk = os.read(self._open_fd, size - len(data))
            if not chunk:
                break
            data += chunk
        keep = data.rfind(b"\n") + 1
        os.ftruncate(self._open_fd, keep)
        os.fsync(self._open_fd)
        return keep

    def _fail(self, err: OSError, doing: str) -> LensprobeError:
        self._failed = True
        with contextlib.suppress(OSError):  # remove a row cut short, so the file ends with a whole row
            if os.fstat(self._open_fd).st_size > self._size:
                os.ftruncate(self._open_fd, self._size)
        if doing == "writing to":  # the rows before the failed one may still reach the disk
            with contextlib.suppress(OSError):
                os.fsync(self._open_fd)
                self.synced = self.written
        return LensprobeError(
            f"{doing} {self.path} failed ({err.strerror or err}): {self.synced} row(s) of this run are safely on "
            "disk. Free disk space (or fix the storage), then rerun the same command: it resumes after them."
        )

    def write(self, row: dict[str, Any]) -> None:
        """Append one row (on disk after the next :meth:`sync`).

        Raises:
            LensprobeError: the operating system refused the write (e.g. the disk is full).
        """
        if self._failed:
            raise LensprobeError(f"{self.path} had a write error earlier: rerun the command to resume.")
        self._check_still_there()
        data = row_line(row).encode("utf-8")
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._open_fd, view)
                if n <= 0:
                    raise OSError(errno.EIO, "the operating system wrote nothing")
                view = view[n:]
        except OSError as err:
            raise self._fail(err, "writing to") from err
        self._size += len(data)
        self.written += 1

    def _check_still_there(self) -> None:
        """Refuse to append to a file whose folder (or the file itself) was deleted: the rows would be lost."""
        try:
            here, ours = os.stat(self.path), os.fstat(self._open_fd)
            gone = (here.st_dev, here.st_ino) != (ours.st_dev, ours.st_ino)
        except OSError:
            gone = True
        if gone:
            self._failed = True
            what = (f"the output folder {self.path.parent}" if not self.path.parent.is_dir()
                    else f"the results file {self.path}")
            raise LensprobeError(f"{what} was deleted during the run: the {self.written} row(s) written so far are "
                                 "lost with it. Rerun the command to start again (keep the folder until it ends).")

    def sync(self) -> None:
        """Make every written row durable (``fsync``).

        Raises:
            LensprobeError: ``fsync`` failed: the rows since the last sync may not be on disk.
        """
        if self._failed:
            return
        try:
            os.fsync(self._open_fd)
        except OSError as err:
            raise self._fail(err, "saving (fsync)") from err
        self.synced = self.written

    @property
    def _open_fd(self) -> int:
        if self._fd is None:
            raise LensprobeError(f"{self.path} is closed: open a new RowWriter to write to it.")
        return self._fd

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def close(self) -> None:
        """Sync (unless a write failed), close the file and release the lock."""
        if self._fd is None:
            return
        try:
            self.sync()
        finally:
            self._close_fd()

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
