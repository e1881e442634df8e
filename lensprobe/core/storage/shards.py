"""Sharding work over processes: who computes which unit, where the results meet, and resuming.

Work that splits into independent units (a prompt of a trace set, a batch of heads of one
prompt in an ablation sweep, a patched site, a problem of an evaluation) is spread over the
processes a launcher starts (``torchrun``, ``accelerate launch``, ``srun``, ``mpirun``):

- :func:`shard_info` reads this process's ``(rank, world_size)`` from the environment;
- :func:`my_units` gives rank ``r`` every ``world_size``-th unit, starting at unit ``r``;
- :func:`run_sharded` computes this rank's units that are not on disk yet, keeping each result
  in the results store (:class:`~lensprobe.core.storage.store.ShardStore`: ``shards.json`` with what the
  run computes and its hash, one ``shard-rank{R}.jsonl`` per process, to which each finished unit
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

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch
from tqdm.auto import tqdm

from lensprobe.core.errors import LensprobeError
from lensprobe.core.storage.identity import check_identity_rule

# The results store, re-exported from its old home (lensprobe.core.storage.shards.ShardStore ...).
from lensprobe.core.storage.store import POLL_SECONDS as POLL_SECONDS
from lensprobe.core.storage.store import SETTINGS_FILE as SETTINGS_FILE
from lensprobe.core.storage.store import STALL_TIMEOUT as STALL_TIMEOUT
from lensprobe.core.storage.store import ShardStore as ShardStore
from lensprobe.core.storage.store import atomic_file as atomic_file
from lensprobe.core.storage.store import atomic_write_json as atomic_write_json
from lensprobe.core.storage.store import open_folder, read_json

__all__ = ["bind_local_gpu", "check_shard", "my_units", "run_sharded", "shard_info"]

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
                progress: bool | str = False, stall_timeout: float | None = None) -> dict[str, Any]:
    """Compute ``compute(unit)`` for every unit, spread over the processes of a launcher, resumably.

    Args:
        units: unit names (unique strings), in a fixed order every process agrees on.
        compute: ``unit -> JSON-able result``; called only for this rank's units not on disk.
        out: the folder where the processes' results meet (see :class:`~lensprobe.core.storage.store.ShardStore`);
            ``None`` computes every unit in memory (no sharding, no resuming).
        kind, settings: what the run computes, for refusing a folder of another run. Settings
            built by :func:`~lensprobe.core.storage.identity.run_identity` name their identity rule, and a
            folder written under another rule is refused (:func:`~lensprobe.core.storage.identity.check_identity_rule`).
        rank, world_size: this process's shard; default from the environment (:func:`shard_info`).
        progress: a progress bar over the units this process computes (a string: its label).
        stall_timeout: how long rank 0 waits without news from the other ranks (default
            :data:`~lensprobe.core.storage.store.STALL_TIMEOUT` seconds).

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
    recorded = open_folder(out) / SETTINGS_FILE
    if "identity" in settings and recorded.is_file():
        check_identity_rule(read_json(recorded).get("settings") or {}, out)
    with ShardStore(out, kind, settings, rank=rank) as store:
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
