"""Reading a file lensprobe is given: a regular file of bounded size, checked before a byte is read.

A path can name something that is not a file: a link to ``/dev/zero`` or ``/dev/full`` (a read
never ends), a FIFO (a read waits forever for a writer), a folder, a socket. Every file lensprobe
reads (result rows, ``config.json``, recipes, problem files, task files, traces, a model folder's
settings and weights' headers) goes through :func:`check_file` (for readers that open the file
themselves, such as Parquet's) or is read whole with :func:`read_bytes` / :func:`read_text`: the
file is opened without waiting (``O_NONBLOCK``), its kind and size are read from the open file
(so a link is judged by what it points to), and anything but a regular file within ``limit`` bytes
is refused, naming the file, what it is and what to do.

Example:
    >>> read_text(Path("runs/x/config.json"), "settings file")[:1]
    '{'
    >>> read_text(Path("/dev/zero"), "results file")
    Traceback (most recent call last):
    lensprobe.core.errors.LensprobeError: results file /dev/zero is a character device, not a regular file: ...
"""

import hashlib
import os
import stat
from pathlib import Path

from lensprobe.core.errors import LensprobeError

__all__ = ["DATA_LIMIT", "SETTINGS_LIMIT", "check_file", "file_sha256", "read_bytes", "read_text"]

SETTINGS_LIMIT = 64 * 2**20
"""Largest settings file read (``config.json``, a recipe, a task file, a listing): 64 MiB."""
DATA_LIMIT = 4 * 2**30
"""Largest data file read (result rows, a problem file, a trace): 4 GiB."""

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _size_text(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def _open(path: Path, what: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise LensprobeError(f"{what} {path} does not exist: check the path.") from None
    except OSError as err:
        raise LensprobeError(f"cannot open {what} {path} ({err.strerror or err}): check the path and its "
                             "permissions.") from None


def _checked(fd: int, path: Path, what: str, limit: int) -> int:
    """The size of the open file ``fd``; refused when it is not a regular file or is over ``limit``."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a file")
        link = f" (a link to {os.path.realpath(path)})" if Path(path).is_symlink() else ""
        raise LensprobeError(f"{what} {path}{link} is {kind}, not a regular file: lensprobe reads only regular "
                             "files; give the path of a file.")
    if info.st_size > limit:
        raise LensprobeError(f"{what} {path} is {_size_text(info.st_size)}, more than the {_size_text(limit)} "
                             f"lensprobe reads for a {what}: check that it is the right file.")
    return info.st_size


def check_file(path: str | os.PathLike, what: str, limit: int = SETTINGS_LIMIT) -> int:
    """Check that ``path`` is a regular file of at most ``limit`` bytes (for a reader that opens it
    itself, such as Parquet's); returns its size.

    Args:
        path: the file (a link is judged by what it points to).
        what: what the file is, for the message (``"problem file"``).
        limit: the largest size accepted, in bytes.

    Raises:
        LensprobeError: the path is missing, unreadable, not a regular file, or larger than ``limit``.

    Example:
        >>> check_file(Path("math500.parquet"), "problem file", DATA_LIMIT)
        123456
    """
    path = Path(path)
    fd = _open(path, what)
    try:
        return _checked(fd, path, what, limit)
    finally:
        os.close(fd)


def read_bytes(path: str | os.PathLike, what: str, limit: int = SETTINGS_LIMIT) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (checked on the open file,
    before reading, and again while reading: a file that grows past ``limit`` is refused).

    Raises:
        LensprobeError: see :func:`check_file`.

    Example:
        >>> read_bytes(Path("runs/x/results-rank0.jsonl"), "results file", DATA_LIMIT)[:1]
        b'{'
    """
    path = Path(path)
    fd = _open(path, what)
    try:
        size = _checked(fd, path, what, limit)
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, max(size - total, 0) + 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise LensprobeError(f"{what} {path} grew past the {_size_text(limit)} lensprobe reads while it "
                                     "was read: check what writes to it.")
    except OSError as err:
        raise LensprobeError(f"cannot read {what} {path} ({err.strerror or err}): check the file.") from None
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike, what: str, limit: int = SETTINGS_LIMIT) -> str:
    """The UTF-8 text of ``path`` (see :func:`read_bytes`).

    Raises:
        LensprobeError: see :func:`check_file`, or bytes that are not UTF-8 (the message names the
            first one's offset).

    Example:
        >>> read_text(Path("my-recipe.toml"), "recipe file")[:6]
        'title '
    """
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise LensprobeError(f"{what} {path} is not UTF-8 text (byte {err.start} is {data[err.start]:#04x}): save "
                             "it as UTF-8.") from None


def file_sha256(path: str | os.PathLike, what: str, limit: int = DATA_LIMIT) -> str:
    """SHA-256 (hex) of the whole of ``path``, a regular file of at most ``limit`` bytes, checked as by
    :func:`check_file` on the open file before a byte is read (a FIFO or a device is refused at once).

    Raises:
        LensprobeError: see :func:`check_file`, or a read error.

    Example:
        >>> len(file_sha256(Path("model.safetensors"), "model weights"))
        64
    """
    path = Path(path)
    fd = _open(path, what)
    try:
        _checked(fd, path, what, limit)
        os.set_blocking(fd, True)
        h, buf = hashlib.sha256(), bytearray(1 << 20)
        view = memoryview(buf)
        with open(fd, "rb", buffering=0, closefd=False) as fh:
            while n := fh.readinto(buf):
                h.update(view[:n])
        return h.hexdigest()
    except OSError as err:
        raise LensprobeError(f"cannot read {what} {path} ({err.strerror or err}): check the file.") from None
    finally:
        os.close(fd)
