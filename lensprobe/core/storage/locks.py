"""One process at a time: a lock file that names its holder and outlives a killed process.

:class:`FileLock` guards a file or folder that one process at a time may write (a rank of a
sharded run, a results file of an evaluation). The lock file holds the holder's pid, host
name and start time as JSON, and on POSIX systems is also ``flock``-ed while held:

- a second process asking for a held lock gets a :class:`~lensprobe.core.errors.LensprobeError`
  naming the holder (pid and host);
- a lock left behind by a process that died without releasing it (``SIGKILL``, a crash, a
  power cut) is *stale*: when it names a process of this host that no longer holds it, the
  next process takes it over and logs a warning (logger ``lensprobe.core.storage.locks``);
- a lock left by a process of another host cannot be checked from here: it is refused with a
  message saying which file to delete once that process is known to be gone.

The lock file is opened without waiting: a FIFO, a device or a folder put in its place is refused
at once, naming the file to delete (a read of a FIFO would wait for ever). A lock never waits: a
caller that waits for one states its limit (e.g. the model cache's, :func:`lensprobe.core.models.cache.wait_limit`).

A released lock deletes its file (a process that opened the old file meanwhile notices and
tries again), so a finished run leaves no lock files.

Example:
    >>> with FileLock("runs/x/.rank0.lock", busy="rank 0 of runs/x is being run by another process ({holder})"):
    ...     pass
"""

import contextlib
import json
import logging
import os
import socket
import stat
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from lensprobe.core.errors import LensprobeError
from lensprobe.core.storage.nesting import parse_json
from lensprobe.core.storage.writer import open_in, remove_file

try:  # POSIX: the lock file is also flock-ed while held
    import fcntl as _fcntl

    fcntl: ModuleType | None = _fcntl
except ImportError:  # pragma: no cover - not on POSIX: the pid in the file decides
    fcntl = None

__all__ = ["FileLock", "lock_holder", "pid_alive"]


logger = logging.getLogger(__name__)
"""Reports stale locks taken over (a warning; shown on stderr when logging is not configured)."""


def pid_alive(pid: int) -> bool:
    """True when a process with this pid runs on this host (a zombie counts as gone).

    Example:
        >>> pid_alive(os.getpid())
        True
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    except OverflowError:
        return False
    try:  # a killed child not yet reaped by its parent is a zombie: gone for our purpose
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _open_lock(path: Path | str | os.PathLike, flags: int) -> int:
    """Open the lock file without waiting (``O_NONBLOCK``); anything but a regular file (a FIFO, a device,
    a folder) is refused at once, naming the file to delete."""
    try:
        fd = open_in(Path(path).parent, path, flags | os.O_NONBLOCK)
    except IsADirectoryError:
        fd = -1
    if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd >= 0:
            os.close(fd)
        raise LensprobeError(f"the lock file {path} is not a regular file (a FIFO, a device or a folder was put "
                             "there): delete it and retry.")
    os.set_blocking(fd, True)
    return fd


def _read_holder(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)  # (os.pread is POSIX-only)
    data = os.read(fd, 4096)
    if not data.strip():
        return None
    try:
        holder = parse_json(data, "lock file")
    except ValueError:
        return {"pid": None, "host": None, "raw": data[:80].decode("utf-8", "replace")}
    return holder if isinstance(holder, dict) else {"pid": None, "host": None}


def lock_holder(path: str | os.PathLike) -> dict[str, Any] | None:
    """What a lock file says about its holder (``pid``, ``host``, ``since``), or ``None`` when it
    is missing or empty (free).

    Example:
        >>> lock_holder("runs/x/.rank0.lock")
        {'pid': 4242, 'host': 'node1', 'since': '2026-01-01 10:00:00'}
    """
    try:
        fd = _open_lock(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return _read_holder(fd)
    finally:
        os.close(fd)


def _describe(holder: dict[str, Any] | None) -> str:
    if not holder or holder.get("pid") is None:
        return "holder unknown"
    return f"pid {holder['pid']} on host {holder.get('host')}"


class FileLock:
    """An exclusive lock on ``path`` for this process (see the module docstring).

    Args:
        path: the lock file (created if missing; its folder must exist).
        busy: the error message when another process holds the lock; ``{holder}`` is replaced
            by the holder's pid and host. It should say what to do.

    Raises:
        LensprobeError: (from :meth:`acquire`) another live process holds the lock, or a
            process of another host left it.

    Example:
        >>> lock = FileLock("out/.results-rank0.lock", busy="out is in use ({holder}): wait for it.")
        >>> lock.acquire(); lock.release()
    """

    def __init__(self, path: str | os.PathLike, *, busy: str = "{path} is locked by another process ({holder}): wait for it.") -> None:
        self.path = Path(path)
        self.busy = busy
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def _refuse(self, holder: dict[str, Any] | None, extra: str = "") -> LensprobeError:
        return LensprobeError(self.busy.format(holder=_describe(holder), path=self.path) + extra)

    def acquire(self) -> "FileLock":
        """Take the lock (at once, or fail); a stale lock is taken over, with a warning logged."""
        if self._fd is not None:
            return self
        for _ in range(100):
            fd = _open_lock(self.path, os.O_RDWR | os.O_CREAT)
            try:
                holder = self._check(fd)
                if not self._same_file(fd):  # released (deleted) between our open and our lock: again
                    os.close(fd)
                    continue
                if holder is not None:
                    logger.warning("%s: took over a stale lock left by %s, which no longer runs (killed or "
                                   "crashed); its results up to then are kept.", self.path, _describe(holder))
                info = {"pid": os.getpid(), "host": socket.gethostname(),
                        "since": time.strftime("%Y-%m-%d %H:%M:%S")}
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                os.write(fd, (json.dumps(info) + "\n").encode("utf-8"))
                os.fsync(fd)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            return self
        raise LensprobeError(f"{self.path} keeps being replaced by other processes: check who else writes there.")

    def _same_file(self, fd: int) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        own = os.fstat(fd)
        return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)

    def _check(self, fd: int) -> dict[str, Any] | None:
        """Raise when another process holds the lock; return a stale holder to take over (else ``None``)."""
        # an empty file is one being created by its holder (or released): the flock decides
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise self._refuse(_read_holder(fd)) from None
        holder = _read_holder(fd)
        if holder is None:
            return None
        pid, host = holder.get("pid"), holder.get("host")
        if host is not None and host != socket.gethostname():
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
            raise self._refuse(holder, f" If that process is no longer running, delete {self.path} and retry.")
        if fcntl is None and isinstance(pid, int) and pid != os.getpid() and pid_alive(pid):
            raise self._refuse(holder)
        # On this host the flock is free (or the pid is gone): whoever wrote the file no longer holds it.
        return holder

    def release(self) -> None:
        """Release the lock and delete the lock file."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(OSError):
                if self._same_file(fd):
                    remove_file(self.path.parent, self.path)  # still locked: a waiting process retries on a new file
        finally:
            os.close(fd)  # closing the descriptor drops the flock

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
