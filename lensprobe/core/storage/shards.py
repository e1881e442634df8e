"""Sharding work over processes: who computes which unit, where the results meet, and resuming.

Work that splits into independent units (a prompt of a trace set, a batch of heads of one
prompt in an ablation sweep, a patched site, a problem of an evaluation) is spread over the
processes a launcher starts (``torchrun``, ``accelerate launch``, ``srun``, ``mpirun``):

- :func:`shard_info` reads this process's ``(rank, world_size)`` from the environment;
- :func:`my_units` gives rank ``r`` every ``world_size``-th unit, starting at unit ``r``;
- :func:`run_sharded` computes this rank's units that are not on disk yet, keeping each result
  in the results store (:class:`ShardStore`: ``config.json`` with what the run computes and its hash
  (:mod:`lensprobe.core.storage.runconfig`), one ``shard-rank{R}.jsonl`` per process, to which each finished unit
  is appended as one row and fsynced before the next unit starts, so a crash loses at most the
  unit being computed), and on rank 0 waits for the other ranks' files
  (:func:`~lensprobe.core.storage.store.wait_for_units`) and returns every unit's result.

Processes meet only through files, so no ``torch.distributed`` process group is needed, and
the folder must be on a filesystem all processes share. Each unit is computed by the same
code whatever the number of processes, so a merged result equals a single-process run. A
rerun with the same folder skips the units on disk (also those computed with another number
of processes); a folder holding another run's settings is refused.

Example:
    >>> rank, world_size = shard_info()          # (0, 1) outside a launcher
    >>> my_units(["a", "b", "c", "d", "e"], 1, 2)
    ['b', 'd']
    >>> run_sharded(["a", "b"], lambda u: len(u), out="runs/x", kind="demo", settings={"v": 1})
    {'a': 1, 'b': 1}
"""

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from lensprobe.core.errors import LensprobeError
from lensprobe.core.progress import tqdm
from lensprobe.core.storage.locks import FileLock
from lensprobe.core.storage.rowfiles import RowWriter, read_row_file
from lensprobe.core.storage.runconfig import CONFIG_FILE, OLD_SETTINGS_FILE, open_run
from lensprobe.core.storage.store import (
    POLL_SECONDS,
    merge_rows,
    open_folder,
    other_run_error,
    wait_for_units,
)

__all__ = ["ShardStore", "bind_local_gpu", "check_shard", "my_units", "run_sharded", "shard_info"]

_RANK_FILE = "shard-rank{}.jsonl"
_OLD_RANK_FILE = "shard-rank{}.json"

T = TypeVar("T")

_ENV_PAIRS = (("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"))


def shard_info() -> tuple[int, int]:
    """``(rank, world_size)`` from the launcher's environment; ``(0, 1)`` when not sharded.

    Reads ``RANK``/``WORLD_SIZE`` (``torchrun``, ``accelerate launch``), else Open MPI's or
    MPICH's variables (``mpirun``, ``accelerate launch --cpu`` with an MPI hostfile).

    Raises:
        LensprobeError: the variables are set but are not integers.

    Example:
        >>> shard_info()   # under torchrun --nproc-per-node 2, in the second process
        (1, 2)
    """
    for rank_var, size_var in _ENV_PAIRS:
        if rank_var in os.environ and size_var in os.environ:
            try:
                return int(os.environ[rank_var]), int(os.environ[size_var])
            except ValueError:
                raise LensprobeError(
                    f"{rank_var}={os.environ[rank_var]!r} / {size_var}={os.environ[size_var]!r} are not integers: "
                    "unset them, or start the processes with a launcher such as torchrun."
                ) from None
    return 0, 1


def check_shard(rank: int | None, world_size: int | None, out: Any) -> tuple[int, int]:
    """This process's ``(rank, world_size)``: the given values, else :func:`shard_info`'s.

    Raises:
        LensprobeError: ``rank`` is not in ``0 .. world_size - 1``, or the run is sharded
            (``world_size > 1``) but has no output folder ``out`` to meet in.

    Example:
        >>> check_shard(None, None, None)   # outside a launcher
        (0, 1)
    """
    if rank is None or world_size is None:
        env_rank, env_world = shard_info()
        rank = env_rank if rank is None else rank
        world_size = env_world if world_size is None else world_size
    _check_rank(rank, world_size)
    if world_size > 1 and out is None:
        raise LensprobeError(
            f"a sharded run (world size {world_size}) needs an output folder (out=...) on a filesystem every "
            "process shares: the processes' results meet there."
        )
    return rank, world_size


def _check_rank(rank: Any, world_size: Any) -> None:
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, world_size))
    if not (ints and world_size >= 1 and 0 <= rank < world_size):
        raise LensprobeError(f"bad shard: rank {rank} of world size {world_size}; need 0 <= rank < world_size.")


def my_units(units: Sequence[T], rank: int, world_size: int) -> list[T]:
    """The units rank ``rank`` of ``world_size`` computes: every ``world_size``-th, from unit ``rank``.

    Raises:
        LensprobeError: ``rank`` is not in ``0 .. world_size - 1``.

    Example:
        >>> my_units(list(range(7)), 2, 3)
        [2, 5]
    """
    _check_rank(rank, world_size)
    return list(units)[rank::world_size]


def bind_local_gpu() -> int | None:
    """Make this process's GPU the one of its local rank (``LOCAL_RANK``), if there are GPUs.

    Launchers start one process per GPU but leave every process on GPU 0; after this call
    ``"cuda"`` (the default device of :func:`lensprobe.load_model`) means GPU ``LOCAL_RANK``.

    Returns:
        The GPU index chosen, or ``None`` (no GPU, or no ``LOCAL_RANK`` in the environment).

    Example:
        >>> bind_local_gpu()   # on a CPU-only machine
    """
    local = os.environ.get("LOCAL_RANK")
    if local is None or not local.isdigit() or not torch.cuda.is_available():
        return None
    index = int(local) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return index


def run_sharded(units: Sequence[str], compute: Callable[[str], Any], *, out: str | os.PathLike | None,
                kind: str, settings: Mapping[str, Any], rank: int | None = None, world_size: int | None = None,
                progress: bool | str = False, stall_timeout: float | None = None,
                ids: Mapping[str, str] | None = None, parts: Mapping[str, dict] | None = None) -> dict[str, Any]:
    """Compute ``compute(unit)`` for every unit, spread over the processes of a launcher, resumably.

    Args:
        units: unit names (unique strings), in a fixed order every process agrees on.
        compute: ``unit -> JSON-able result``; called only for this rank's units not on disk.
        out: the folder where the processes' results meet (see :class:`ShardStore`);
            ``None`` computes every unit in memory (no sharding, no resuming).
        kind, settings: what the run computes, for refusing a folder of another run. Settings
            built by :func:`~lensprobe.core.storage.runidentity.run_identity` name their identity rule, and a
            folder written under another rule is refused (:func:`~lensprobe.core.storage.runidentity.check_identity_rule`).
        rank, world_size: this process's shard; default from the environment (:func:`shard_info`).
        progress: a progress bar over the units this process computes (a string: its label).
        stall_timeout: how long rank 0 waits without news from the other ranks (default
            :func:`~lensprobe.core.storage.store.stall_limit`: ``$LENSPROBE_STALL_TIMEOUT``, else
            :data:`~lensprobe.core.storage.store.STALL_TIMEOUT` seconds).
        ids: unit -> the digest of the token ids it is computed from
            (:func:`~lensprobe.core.storage.jsonable.prompt_ids_digest`), recorded in its row and
            checked when the run resumes (see :class:`ShardStore`).
        parts: what the run resolved beside its settings (a trace set's engine), recorded in
            ``config.json``'s parts (:func:`~lensprobe.core.storage.runconfig.open_run`).

    Returns:
        unit -> result, in the order of ``units``: every unit on rank 0 (after waiting for the
        other ranks), this rank's units on the others. With ``out``, results are as read back
        from JSON (tuples become lists), whether computed now or found on disk.

    Raises:
        LensprobeError: a bad shard, a sharded run without ``out``, a folder of another run (or
            of an older identity rule),
            units named twice, or (rank 0) other ranks that stall (see
            :func:`~lensprobe.core.storage.store.wait_for_units`).

    Example:
        >>> run_sharded(["p0", "p1"], lambda u: {"n": len(u)}, out="runs/x", kind="demo", settings={})
        {'p0': {'n': 2}, 'p1': {'n': 2}}
    """
    units = list(units)
    if len(set(units)) != len(units):
        raise LensprobeError("unit names must be unique: name each unit of work once.")
    rank, world_size = check_shard(rank, world_size, out)
    label = progress if isinstance(progress, str) else "units"
    if out is None:
        with tqdm(units, desc=label, unit="unit", disable=not progress) as bar:
            return {u: compute(u) for u in bar}
    with ShardStore(out, kind, settings, rank=rank, ids=ids, parts=parts) as store:
        done = store.done()
        mine = my_units(units, rank, world_size)
        todo = [u for u in mine if u not in done]
        desc = label if world_size == 1 else f"{label} (rank {rank}/{world_size})"
        with tqdm(total=len(todo), desc=desc, unit="unit", disable=not progress or not todo) as bar:
            for u in todo:
                done[u] = store.record(u, compute(u))
                bar.update(1)
        if rank == 0 and world_size > 1:
            return store.wait(units, world_size, stall_timeout=stall_timeout)
        return {u: done[u] for u in (units if world_size == 1 else mine)}


class ShardStore:
    """One sharded run's folder: its settings, and every finished unit of every rank.

    ``config.json`` holds what the run computes and its hash
    (:func:`~lensprobe.core.storage.runconfig.open_run`, the one layout of every run's settings); each rank appends one row per
    finished unit, ``{"unit": name, "result": value, "run": hash, "ids": digest}``, to ``shard-rank{R}.jsonl`` (a
    :class:`~lensprobe.core.storage.rowfiles.RowWriter`: one ``os.write`` per row, ``fsync``
    before :meth:`record` returns), so a finished unit survives a kill and a crash loses at most
    the unit being computed (a row cut short is skipped by readers and cut off before this rank
    appends again). Rows are never rewritten: recording a unit costs the same however many are
    on disk.

    Every row records the run that wrote it (``run``: the ``hash`` of ``config.json``) and, when
    the unit is computed from token ids, their digest (``ids``); a row read back is refused, naming
    its file, line and unit, when its run is not the folder's (a ``config.json`` replaced by another
    run's, a row edited or copied in) or its ids are not this run's (another tokenizer or prompt):
    rows of another run are never adopted. A new kind of run gets these checks by writing its rows here.

    Args:
        out: the folder (created if missing); every process of the run passes the same one.
        kind: what the run computes (``"ablation sweep"``, ``"patch"``, ``"trace set"``, ...).
        settings: JSON-able description of everything that changes the results; a folder
            holding another kind or other settings is refused.
        rank: this process's rank; it alone appends to ``shard-rank{rank}.jsonl`` (locked while open).
        ids: unit -> the digest of its token ids (recorded and checked; units not named record none).
        parts: name -> identity (with a ``"hash"``) recorded in ``config.json``'s parts; a part of
            the same name with another hash is refused.

    Raises:
        LensprobeError: the folder holds another run (the settings that differ are listed), rows
            without a ``config.json``, files of an older lensprobe (``shards.json``,
            ``shard-rank{R}.json``), or another process holds this rank.

    Example:
        >>> with ShardStore("runs/x", "demo", {"v": 1}, rank=0) as store:
        ...     _ = store.record("a", 1.5)
        ...     store.done()
        {'a': 1.5}
    """

    def __init__(self, out: str | os.PathLike, kind: str, settings: Mapping[str, Any], *, rank: int = 0,
                 ids: Mapping[str, str] | None = None, parts: Mapping[str, dict] | None = None) -> None:
        self.out = open_folder(out)
        self.rank = rank
        self.ids = dict(ids or {})
        self._refuse_old_files()
        self.config = open_run(self.out, kind, settings, rows=_RANK_FILE.format("*"), parts=parts)
        self._lock = FileLock(self.out / f".shard-rank{rank}.lock",
                              busy=f"rank {rank} of {self.out} is being run by another process ({{holder}}): wait "
                                   "for it, or give each process its own rank (start them with a launcher such as "
                                   "torchrun).").acquire()
        self._writer: RowWriter | None = None  # opened at the first record (under the rank lock)

    def _refuse_old_files(self) -> None:
        old = sorted(p.name for p in self.out.glob(_OLD_RANK_FILE.format("*")))
        if old and not (self.out / OLD_SETTINGS_FILE).is_file():  # with it, open_run says what the folder is
            raise other_run_error(
                f"{self.out} holds shard files of an older format ({', '.join(old)}; finished units are now "
                "rows of shard-rank{R}.jsonl), which lensprobe no longer reads",
                fix="Rerun into a new output folder (or delete this one to start over).")

    def _rank_files(self) -> list[Path]:
        """Every rank's row file in the folder, by rank."""
        files = {}
        for path in self.out.glob(_RANK_FILE.format("*")):
            number = path.name.removeprefix("shard-rank").removesuffix(".jsonl")
            if number.isdigit():
                files[int(number)] = path
        return [files[rank] for rank in sorted(files)]

    def done(self) -> dict[str, Any]:
        """Every finished unit in the folder -> its result: every rank's rows (as on disk, a row cut
        short by a crash skipped) merged by :func:`merge_rows`, rank files by rank, lines in order.

        Raises:
            LensprobeError: two rows hold one unit with different results (in two ranks' files,
                or twice in one), or a row is damaged.
        """
        located = []
        for path in self._rank_files():
            for line_no, row in read_row_file(path):
                if not (isinstance(row, dict) and isinstance(row.get("unit"), str) and "result" in row):
                    raise LensprobeError(f"{path} line {line_no} is not a finished unit ({{\"unit\": ..., "
                                         "\"result\": ...}): the file was edited or damaged; delete that line to "
                                         "compute its unit again.")
                self._check_row(row, path, line_no)
                located.append((f"{path} unit {row['unit']!r} (line {line_no})", row["unit"], row["result"]))
        merged = merge_rows(located, fix="delete that unit's line from one of the files (or delete the file)")
        return {str(unit): result for unit, result in merged.items()}

    def _check_row(self, row: dict, path: Path, line_no: int) -> None:
        """Refuse a row of another run (its ``run`` is not the folder's hash) or of other token ids."""
        where = f"{path} line {line_no} (unit {row['unit']!r})"
        fix = ("rows of another run are never adopted: use a new output folder, or delete this one to start over "
               "(deleting that line computes its unit again).")
        if "run" not in row:
            raise LensprobeError(f"{where} records no run: it was written by an older lensprobe, so whose row it is "
                                 "cannot be checked. Rerun into a new output folder (or delete this one to start "
                                 "over).")
        if row["run"] != self.config["hash"]:
            raise LensprobeError(f"{where} records run {row['run']!r}, but the folder's {CONFIG_FILE} is run "
                                 f"{self.config['hash']!r}: {fix}")
        want = self.ids.get(row["unit"])
        if want is not None and row.get("ids") != want:
            raise LensprobeError(f"{where} was computed from token ids with digest {row.get('ids')!r}, but this run's "
                                 f"are {want!r} (another tokenizer or prompt): {fix}")

    def record(self, unit: str, result: Any) -> Any:
        """Append one finished unit's JSON-able result to this rank's file (with the run's hash and the
        unit's token ids digest), on disk (fsynced) when this returns; returns the result as read back
        from JSON."""
        row = json.loads(json.dumps({"unit": unit, "result": result, "run": self.config["hash"],
                                     "ids": self.ids.get(unit)}))
        if self._writer is None:
            self._writer = RowWriter(self.out / _RANK_FILE.format(self.rank), locked=True)
        self._writer.write(row)
        self._writer.sync()
        return row["result"]

    def wait(self, units: Sequence[str], world_size: int, *, stall_timeout: float | None = None,
             poll: float = POLL_SECONDS) -> dict[str, Any]:
        """Wait until every unit is in the folder (:func:`wait_for_units`); returns unit -> result for ``units``.

        Raises:
            LensprobeError: no rank finished a unit for ``stall_timeout`` seconds (default
                :data:`~lensprobe.core.storage.store.STALL_TIMEOUT`); the message names the ranks still missing.
        """
        def look() -> tuple[int, dict[str, Any]]:
            have = self.done()
            return len(have), have

        have = wait_for_units(self.out, units, world_size, look, stall_timeout=stall_timeout, poll=poll)
        return {u: have[u] for u in units}

    def close(self) -> None:
        """Close this rank's file and release this rank's lock."""
        writer, self._writer = self._writer, None
        try:
            if writer is not None:
                writer.close()
        finally:
            self._lock.release()

    def __enter__(self) -> "ShardStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
