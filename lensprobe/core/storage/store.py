"""The results store: how every run keeps its results in a folder that several processes share.

Evaluations (:mod:`lensprobe.evals.results.folder`), ablation sweeps, activation patching and trace
sets (through :func:`lensprobe.core.storage.shards.run_sharded`) keep their results here, in the same
way:

- **Atomic writes.** Every file lensprobe writes whole (settings, summaries, CSV tables, traces,
  figures, report pages) goes through :func:`atomic_file` (of :mod:`lensprobe.core.storage.writer`, the one
  writer and deleter) (:func:`atomic_write_text` and
  :func:`atomic_write_json` are built on it): a temporary file in the same folder, ``fsync``,
  then ``os.replace``. Readers see the old file or the whole new one; a write that fails leaves
  the old file as it was and no temporary file. Results are appended as rows instead
  (:class:`~lensprobe.core.storage.rowfiles.RowWriter`), never rewritten.
- **Settings.** A folder records what its run computes and a hash of it in ``config.json``, one
  layout for every kind of run (:mod:`lensprobe.core.storage.runconfig`); a run with other
  settings is refused, naming every setting that differs (:func:`settings_diff`,
  :func:`other_run_error`).
- **Locks.** One process per results file (:class:`~lensprobe.core.storage.locks.FileLock`); a lock left
  by a killed process is taken over with a warning. A command writing an output folder holds
  the folder's lock (:func:`~lensprobe.core.storage.outfolder.lock_folder`) while it runs: a second run
  into that folder is refused with the fix (wait for the first, or use another folder), so two
  runs never mix their files. The files a command wrote are listed in
  :data:`~lensprobe.core.storage.outfolder.PAGES_FILE`; the next run into the folder deletes the listed
  files it does not write again (:func:`~lensprobe.core.storage.outfolder.replace_pages`).
- **Shard files.** Each process appends rows only to its own file
  (:mod:`lensprobe.core.storage.rowfiles`): ``shard-rank{R}.jsonl`` (one row per finished unit,
  :class:`~lensprobe.core.storage.shards.ShardStore`, fsynced before the unit counts as recorded) or ``results-rank{R}.jsonl``
  (an evaluation's rows, fsynced after each batch). Rows are never rewritten; a row cut short by
  a crash is skipped by readers and cut off before the rank appends again. Reading merges every
  rank's file. Every row records its run (the hash of ``config.json``) and, when computed from
  token ids, their digest; every line carries the digest of its own content: a row of another
  run, of other ids, or edited is refused, never adopted.
- **One merge rule** (:func:`merge_rows`), for the ranks' files and for reruns: rows are keyed
  (a unit's name; an evaluation's condition, problem and sample); the first complete row for a
  key wins, in reading order (rank files by rank, lines in order); an incomplete row (an
  evaluation's error row, retried by design) stands only until a complete one comes. Two
  complete rows for one key that disagree are an error naming both (a
  :class:`~lensprobe.core.errors.LensprobeError`: which one is right cannot be told, so nothing
  is counted until one is deleted); never "a later rank wins".
- **Waiting.** Rank 0 of a sharded run waits for the other ranks with :func:`wait_for_units`.
  When nothing new reaches the folder for :data:`STALL_TIMEOUT` seconds (an hour; the environment
  variable ``LENSPROBE_STALL_TIMEOUT`` sets another limit, :func:`stall_limit`) it raises a
  :class:`~lensprobe.core.errors.LensprobeError` naming the ranks and the units still missing
  and the fix: rerun the same command. Nothing is lost: every finished unit or row is on disk
  already, and the rerun computes only the missing ones.

Example:
    >>> merge_rows([("rank0 line 1", "a", 1), ("rank1 line 1", "a", 1)])
    {'a': 1}
"""

import json
import math
import os
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from lensprobe.core.errors import LensprobeError
from lensprobe.core.storage.files import read_text
from lensprobe.core.storage.nesting import parse_json
from lensprobe.core.storage.writer import atomic_file

__all__ = ["NEW_FOLDER_FIX", "POLL_SECONDS", "STALL_TIMEOUT", "STALL_TIMEOUT_VAR", "atomic_file",
           "atomic_write_json", "atomic_write_text", "diff_lines", "merge_rows", "open_folder", "other_run_error",
           "read_json", "settings_diff", "stall_limit", "wait_for_units"]

C = TypeVar("C", bound=Collection[str])

STALL_TIMEOUT = 3600.0
"""Seconds rank 0 waits without anything new in the folder before it gives up with an error, unless
the environment variable :data:`STALL_TIMEOUT_VAR` sets another number (:func:`stall_limit`)."""
STALL_TIMEOUT_VAR = "LENSPROBE_STALL_TIMEOUT"
"""The environment variable that overrides :data:`STALL_TIMEOUT` (seconds, a positive number)."""
POLL_SECONDS = 0.5
NEW_FOLDER_FIX = "Use a new output folder, or delete this one to start over."
_MISSING = "<missing>"


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` with :func:`atomic_file`; returns ``path``.

    Example:
        >>> atomic_write_text("runs/x/table.md", "# table\n").name
        'table.md'
    """
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def atomic_write_json(path: str | os.PathLike, data: Any, *, indent: int = 1) -> Path:
    """Write ``data`` as JSON with :func:`atomic_file` (floats written exactly: they read back bit for
    bit; keys keep their order).

    Example:
        >>> atomic_write_json("runs/x/settings.json", {"v": 1}).name
        'settings.json'
    """
    return atomic_write_text(path, json.dumps(data, indent=indent) + "\n")


def _always(row: Any) -> bool:
    return True


def merge_rows(rows: Iterable[tuple[str, Hashable, Any]], *, complete: Callable[[Any], bool] = _always,
               agree: Callable[[Any, Any], bool] = lambda a, b: a == b, fix: str = "delete the wrong one"
               ) -> dict[Hashable, Any]:
    """The one merge rule of the results store, across ranks' files and reruns.

    Rows are keyed. The first complete row for a key wins; an incomplete row (``complete`` false,
    e.g. an evaluation's error row, retried by design) stands only until a complete row for its
    key comes (the last incomplete one is kept while none has). Two complete rows for one key
    that disagree (``agree`` false) are refused, naming both.

    Args:
        rows: ``(where, key, row)`` in reading order (rank files by rank, lines in order); ``where``
            names the row for the error (a file and line, a file and unit).
        complete: whether a row is finished.
        agree: whether two complete rows of one key say the same (default: equal).
        fix: what to do about two rows that disagree (the end of the error).

    Returns:
        key -> the row that counts, keys in first-seen order.

    Raises:
        LensprobeError: two complete rows of one key disagree.

    Example:
        >>> merge_rows([("rank0 line 1", "a", 1), ("rank1 line 1", "b", 2), ("rank1 line 2", "a", 1)])
        {'a': 1, 'b': 2}
    """
    kept: dict[Hashable, tuple[str, Any]] = {}
    for where, key, row in rows:
        seen = kept.get(key)
        if seen is None or not complete(seen[1]):
            kept[key] = (where, row)
        elif complete(row) and not agree(seen[1], row):
            raise LensprobeError(f"two results for {key!r} disagree: {seen[0]} and {where}. Which one is right "
                                 f"cannot be told from the files: {fix}, then rerun (it computes the key again if "
                                 "needed).")
    return {key: row for key, (_, row) in kept.items()}


def read_json(path: Path, fix: str = "delete it to compute its units again") -> Any:
    """The JSON in ``path`` (read with :func:`~lensprobe.core.storage.files.read_text`); a damaged file
    is refused with what to do (``fix``).

    Raises:
        LensprobeError: the file is not valid JSON, not UTF-8, or not a regular file of bounded size.

    Example:
        >>> read_json(Path("runs/x/config.json"))["kind"]
        'demo'
    """
    try:
        return parse_json(read_text(path, "settings file"), f"settings file {path}")
    except json.JSONDecodeError as err:
        raise LensprobeError(f"{path} is not valid JSON ({err.msg}): it was edited or damaged; {fix}.") from None


def open_folder(out: str | os.PathLike) -> Path:
    """The output folder ``out``, created if missing.

    Raises:
        LensprobeError: ``out`` is a file, or the folder cannot be created.

    Example:
        >>> open_folder("runs/x").is_dir()
        True
    """
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise LensprobeError(f"output folder {out} is a file: give a folder path (it is created if missing).")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise LensprobeError(f"cannot create the output folder {out} ({err.strerror}): choose a folder you can "
                             "write to.") from None
    return out


def settings_diff(old: Any, new: Any, at: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any, Any]]:
    """Every setting that differs between a folder's settings (``old``) and this run's (``new``):
    ``(key path, folder's value, this run's value)``; mappings are compared key by key and lists of
    one length item by item (the item's index in the path), a missing key as ``"<missing>"``.

    Example:
        >>> settings_diff({"g": {"n": 16}, "m": "a"}, {"g": {"n": 32}, "m": "a"})
        [(('g', 'n'), 16, 32)]
        >>> settings_diff({"i": [{"c": 1}, {"c": 2}]}, {"i": [{"c": 1}, {"c": 3}]})
        [(('i', '1', 'c'), 2, 3)]
    """
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            out += settings_diff(old.get(key, _MISSING), new.get(key, _MISSING), (*at, str(key)))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new) and at:
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in settings_diff(a, b, (*at, str(i)))]
    return [] if old == new else [(at, old, new)]


def diff_lines(diff: list[tuple[tuple[str, ...], Any, Any]]) -> list[str]:
    """One line per difference of :func:`settings_diff`.

    Example:
        >>> diff_lines([(("g", "n"), 16, 32)])
        ['g.n: folder has 16, this run has 32']
    """
    return [f"{'.'.join(path)}: folder has {a!r}, this run has {b!r}" for path, a, b in diff]


def other_run_error(head: str, lines: Sequence[str] = (), fix: str = NEW_FOLDER_FIX) -> LensprobeError:
    """The error for a folder that holds results of another run: what is wrong (``head``), the
    settings that differ (``lines``, from :func:`diff_lines`), then what to do.

    Example:
        >>> str(other_run_error("runs/x holds results of another configuration", ["n: folder has 1, this run has 2"]))
        'runs/x holds results of another configuration:\\n  n: folder has 1, this run has 2\\nUse a new ...'
    """
    if not lines:
        return LensprobeError(f"{head}. {fix}")
    return LensprobeError(f"{head}:\n  " + "\n  ".join(lines) + f"\n{fix}")


def stall_limit() -> float:
    """How long rank 0 waits without news from the other ranks: ``$LENSPROBE_STALL_TIMEOUT`` seconds
    when set (a cluster whose ranks take longer, a test suite that must fail fast), else
    :data:`STALL_TIMEOUT`. Read when called, so every wait sees the current environment.

    Raises:
        LensprobeError: the variable is set but is not a positive number.

    Example:
        >>> stall_limit()   # with LENSPROBE_STALL_TIMEOUT unset
        3600.0
    """
    given = os.environ.get(STALL_TIMEOUT_VAR, "").strip()
    if not given:
        return STALL_TIMEOUT
    try:
        seconds = float(given)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise LensprobeError(f"{STALL_TIMEOUT_VAR}={given!r} is not a positive number of seconds: set it to one "
                             f"(e.g. 600) or unset it (the default is {STALL_TIMEOUT:g} s).")
    return seconds


def wait_for_units(out: str | os.PathLike, units: Sequence[str], world_size: int, look: Callable[[], tuple[int, C]],
                   *, what: str = "unit", stall_timeout: float | None = None, poll: float = POLL_SECONDS) -> C:
    """Wait until every unit of a sharded run is finished; the one wait of lensprobe.

    Unit ``i`` is computed by rank ``i % world_size`` (:func:`~lensprobe.core.storage.shards.my_units`).

    Args:
        out: the run's folder (named in the error).
        units: every unit's name, in the order the ranks share them.
        world_size: the number of processes.
        look: reads the folder: ``(number of records on disk, finished units)``; a change in
            the number counts as progress.
        what: what a unit is, for the error (``"unit"``, ``"problem"``).
        stall_timeout: seconds without progress before giving up (default :func:`stall_limit`:
            ``$LENSPROBE_STALL_TIMEOUT``, else :data:`STALL_TIMEOUT`, read when called).
        poll: seconds between looks.

    Returns:
        The finished units of the last look (all of ``units`` are in it).

    Raises:
        LensprobeError: nothing new reached the folder for ``stall_timeout`` seconds; names the
            ranks and the units missing. Every finished unit stays on disk: rerunning the same
            command computes only the missing ones.

    Example:
        >>> wait_for_units("runs/x", ["a", "b"], 2, lambda: (2, {"a", "b"}))
        {'a', 'b'}
    """
    stall_timeout = stall_limit() if stall_timeout is None else stall_timeout
    last_count, last_change = -1, time.monotonic()
    while True:
        count, finished = look()
        missing = [i for i, u in enumerate(units) if u not in finished]
        if not missing:
            return finished
        if count != last_count:
            last_count, last_change = count, time.monotonic()
        elif time.monotonic() - last_change > stall_timeout:
            names = ", ".join(f"rank {r}" for r in sorted({i % world_size for i in missing}))
            raise LensprobeError(
                f"gave up waiting in {out}: {names} of {world_size} did not finish {len(missing)} {what}(s) "
                f"(e.g. {units[missing[0]]!r}) and nothing finished for {stall_timeout:g} s. Check that process's "
                "output, then rerun the same command: it resumes where the ranks stopped (every finished "
                f"{what} is saved)."
            )
        time.sleep(poll)
