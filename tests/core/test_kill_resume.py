"""SIGKILL at any point of a resumable run loses no finished unit, and the rerun resumes.

Ablation sweeps, activation patching and trace sets keep every finished unit in the results store
(``shard-rank0.jsonl``, one row appended and fsynced per unit; a trace set also writes one Parquet
file per trace, atomically). Each run here is killed with SIGKILL in a child process forked from the
test process (it holds the tiny model already, so no new interpreter spends seconds importing):

- by the test, once the shard file holds a third of the units (watched as it grows);
- by the test, at a random time after the first unit landed (the seed is in the failure message);
- by the child itself, in the middle of appending a unit's row to the shard file (half the row
  written: the torn last line a crash leaves), and just before a trace set renames a finished
  Parquet file into place (the moment that leaves a temporary file behind).

Then the same run resumes here, and the test checks that every unit the child had recorded (it
journals each one after the store returns) is still on disk, that every unit on disk after the kill is
readable and equal to an uninterrupted run's, that the rerun computes exactly the missing units
(counted at :meth:`ShardStore.record`, which :func:`~lensprobe.core.storage.shards.run_sharded` calls once
per computed unit) and leaves the finished ones' bytes and modification times alone, that the
resumed result equals the uninterrupted run's bit for bit (each unit is the same batch of the
same forward passes whichever process computes it), and that nothing left by the kill (a stale
lock, a temporary file) breaks the rerun.

An evaluation's rows are appended to ``results-rank0.jsonl``; a kill in the middle of writing a row
leaves half of it at the end of the file: readers skip it, and the rerun cuts it off and goes on (the
slow test in ``tests/evals/test_harness.py`` kills a whole evaluation from a new interpreter).

``lensprobe attribute`` has no resumable folder (:func:`lensprobe.attribute_heads` takes no ``out``;
the command recomputes everything and rewrites its files whole): a kill before any of its renames,
or at a random time, must leave each file either the previous run's whole file or the new run's,
and the rerun must write the new run's files.
"""

import fnmatch
import json
import os
import random
import re
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.core.storage.outfolder import FOLDER_LOCK
from lensprobe.core.storage.rowfiles import read_row_file
from lensprobe.core.storage.shards import ShardStore
from lensprobe.evals.results.folder import read_rows

SHARD_FILE = "shard-rank0.jsonl"
SETTINGS = "config.json"
QUESTIONS = ["What is 1+1?", "What is 12*3?", "What is 7-2?", "Name a prime.", "What is 2^5?", "Is 9 odd?"]
SYSTEM = "Please reason step by step."
HOOKS = [f"blocks.{layer}.{hook}" for layer in (0, 1) for hook in ("hook_resid_post", "attn.hook_z", "hook_mlp_out")]
UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)


# ----- the kinds of resumable run ----------------------------------------------------------------
@dataclass(frozen=True)
class Kind:
    """A resumable run: ``run(model, out)`` returns its result; ``same`` asserts two results equal."""

    name: str
    run: Callable[[Any, Path], Any]
    same: Callable[[Any, Any], None]
    pause: float  # seconds the child sleeps after each recorded unit, so the test can kill it mid-run


def _sweep(model, out: Path):
    return lp.ablation_sweep(model, QUESTIONS[:2], "entropy", batch_size=2, progress=False, out=out)


def _same_sweep(a, b) -> None:
    assert torch.equal(a.baseline, b.baseline) and torch.equal(a.ablated, b.ablated)
    assert not a.ablated.isnan().any()


def _patch(model, out: Path):
    source = lp.build_prompt(model, "What is 5*6?", system=SYSTEM)
    target = lp.build_prompt(model, "What is 2+9?", system=SYSTEM)
    return lp.patch(model, source, target, HOOKS, segments=["question", "system"], out=out)


def _same_patch(a, b) -> None:
    assert a.to_dataframe().equals(b.to_dataframe())


def _traces(model, out: Path):
    prompts = [lp.build_prompt(model, q, system=SYSTEM) for q in QUESTIONS]
    return lp.generation.trace_prompts(model, prompts, max_new_tokens=6, track={"system": "system"}, out=out)


def _same_traces(a, b) -> None:
    assert list(a) == list(b)
    for key in a:
        x, y = a[key], b[key]
        assert torch.equal(x.token_ids_rows, y.token_ids_rows) and x.texts == y.texts
        assert torch.equal(x.entropy_rows, y.entropy_rows) and torch.equal(x.chosen_prob_rows, y.chosen_prob_rows)
        assert torch.equal(x.attention_rows["system"], y.attention_rows["system"])


SWEEP = Kind("ablation sweep", _sweep, _same_sweep, 0.05)
PATCH = Kind("patch", _patch, _same_patch, 0.05)
TRACES = Kind("trace set", _traces, _same_traces, 0.08)
KINDS = [pytest.param(k, id=k.name.replace(" ", "-")) for k in (SWEEP, PATCH, TRACES)]


# ----- killing a child -----------------------------------------------------------------------------
def _units(out: Path) -> dict[str, Any]:
    """The finished units in the folder's shard file (``{}`` when there is none yet; a torn last row skipped)."""
    path = out / SHARD_FILE
    units: dict[str, Any] = {}
    for _, row in read_row_file(path) if path.is_file() else ():
        units.setdefault(row["unit"], row["result"])
    return units


def _die_before_rename(into: Callable[[Path], bool], nth: int) -> None:
    """In the child: SIGKILL this process when it is about to rename a finished temporary file onto a
    path ``into`` accepts for the ``nth`` time (the atomic writes of the store all end in ``os.replace``)."""
    real, seen = os.replace, [0]

    def replace(src, dst, *args, **kwargs):
        if into(Path(dst)):
            seen[0] += 1
            if seen[0] == nth:
                os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst, *args, **kwargs)

    os.replace = replace  # type: ignore[assignment]


def _die_mid_row(name: str, nth: int) -> None:
    """In the child: on the ``nth`` write to the file ``name``, write half the bytes, then SIGKILL this
    process (the row is cut where a kill during a long write would cut it)."""
    real, seen = os.write, [0]

    def write(fd, data):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) == name:
            seen[0] += 1
            if seen[0] == nth:
                real(fd, bytes(data)[: len(data) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
        return real(fd, data)

    os.write = write  # type: ignore[assignment]


def _journal_records(journal: Path, pause: float = 0.0) -> None:
    """In the child: after every unit the store records, append its name to ``journal`` (the units this
    run finished, as it saw them), then sleep ``pause`` seconds, so the run lasts long enough to be killed."""
    real = ShardStore.record
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def record(self, unit, result):
        got = real(self, unit, result)
        os.write(fd, (json.dumps(unit) + "\n").encode())
        time.sleep(pause)
        return got

    ShardStore.record = record  # type: ignore[method-assign]


def _finished(journal: Path) -> list[str]:
    """The units the killed child had recorded (its journal)."""
    return [json.loads(line) for line in journal.read_text().splitlines()] if journal.is_file() else []


def _fork(job: Callable[[], Any], log: Path, setup: Callable[[], None] = lambda: None) -> int:
    """Run ``job`` in a forked child (its output in ``log``); returns the child's pid. The child never
    returns into pytest: it leaves with ``os._exit`` (0 when ``job`` ended, 3 when it raised)."""
    pid = os.fork()
    if pid:
        return pid
    code = 3
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = sys.stderr = open(fd, "w", buffering=1, closefd=False)  # noqa: SIM115
        setup()
        job()
        code = 0
    except BaseException:
        os.write(2, traceback.format_exc().encode())
    finally:
        os._exit(code)


def _status(pid: int, log: Path, *, timeout: float = 60.0, until: Callable[[], bool] | None = None) -> int | None:
    """Wait for the child ``pid``: until it ends (returns its wait status) or, with ``until``, until
    ``until()`` holds while it still runs (returns ``None``). A child that hangs is killed and fails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if until is not None and until():
            return None
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"the child did not get there in {timeout:g} s: {log.read_text()[-2000:]}")


def _kill(pid: int, log: Path) -> None:
    """SIGKILL the running child ``pid`` and reap it (a zombie would still hold its pid)."""
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    _assert_killed(status, log)


def _assert_killed(status: int | None, log: Path) -> None:
    assert status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"the run ended before it was killed (status {status}): {log.read_text()[-2000:]}")


def _leftovers(out: Path, expected: Callable[[Path], bool], pid: int) -> list[Path]:
    """The files under ``out`` that are not ``expected``; each must be a temporary file of the killed
    process ``pid`` (``.name.<pid>.tmp.ext``, see :func:`~lensprobe.core.storage.store.atomic_file`)."""
    extra = [p for p in out.rglob("*") if p.is_file() and not expected(p.relative_to(out))]
    strays = [p for p in extra if not fnmatch.fnmatch(p.name, f".*.{pid}.tmp*")]
    assert not strays, f"files left that are neither results nor the killed run's temporary files: {strays}"
    return extra


def _store_file(rel: Path) -> bool:
    return str(rel) in (SETTINGS, SHARD_FILE) or fnmatch.fnmatch(str(rel), "traces/trace-*.parquet")


# ----- the resumable runs: killed, then resumed ---------------------------------------------------------
@pytest.fixture(scope="module")
def clean(tiny, tmp_path_factory):
    """Each kind's uninterrupted run: its folder, its units and its result (computed once)."""
    done = {}
    for kind in (SWEEP, PATCH, TRACES):
        out = tmp_path_factory.mktemp("clean")
        result = kind.run(tiny, out)
        done[kind.name] = (out, _units(out), result)
    return done


def _resume_and_check(kind: Kind, tiny, out: Path, clean, monkeypatch, pid: int, note: str) -> list[Path]:
    """The checks after a kill (see the module docs); returns the temporary files the kill left."""
    clean_out, total, want = clean[kind.name]
    left, finished = _units(out), _finished(out.parent / "journal")
    assert set(finished) <= set(left), f"units the killed run had finished are lost: {set(finished) - set(left)}"
    assert set(left) <= set(total) and len(left) < len(total), note
    assert left == {u: total[u] for u in left}, f"a unit on disk differs from the uninterrupted run's ({note})"
    owned = {u: out / total[u]["file"] for u in left} if kind is TRACES else {}
    # a recorded trace is on disk, whole: it loads and equals the uninterrupted run's
    _same_traces({u: lp.generation.load_trace(p) for u, p in owned.items()},
                 {u: lp.generation.load_trace(clean_out / total[u]["file"]) for u in owned})
    kept = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in owned.values()}
    stale_lock = out / ".shard-rank0.lock"
    assert stale_lock.is_file()  # the killed run could not release its lock
    temps = _leftovers(out, lambda rel: _store_file(rel) or rel == Path(stale_lock.name), pid)

    computed: list[str] = []
    real = ShardStore.record

    def record(self, unit, result):
        computed.append(unit)
        return real(self, unit, result)

    monkeypatch.setattr(ShardStore, "record", record)
    resumed = kind.run(tiny, out)
    monkeypatch.setattr(ShardStore, "record", real)
    assert sorted(computed) == sorted(set(total) - set(left)), f"the rerun computed {computed} ({note})"
    assert _units(out) == total, note
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in owned.values()} == kept, "a finished trace changed"
    kind.same(resumed, want)
    assert not stale_lock.exists()  # the rerun took the stale lock over, then released it
    assert _leftovers(out, _store_file, pid) == temps  # the rerun left nothing of its own
    return temps


@pytest.mark.parametrize("kind", KINDS)
def test_killed_once_a_third_of_the_units_are_saved_then_resumed(kind, tiny, clean, tmp_path, monkeypatch):
    out, log = tmp_path / "run", tmp_path / "child.log"
    n = len(clean[kind.name][1])
    pid = _fork(lambda: kind.run(tiny, out), log, lambda: _journal_records(tmp_path / "journal", kind.pause))
    assert _status(pid, log, until=lambda: len(_units(out)) >= n // 3) is None, log.read_text()[-2000:]
    _kill(pid, log)
    assert len(_units(out)) >= n // 3
    _resume_and_check(kind, tiny, out, clean, monkeypatch, pid, f"killed after {n // 3} of {n} units")


@pytest.mark.parametrize("kind", KINDS)
def test_killed_at_a_random_time_then_resumed(kind, tiny, clean, tmp_path, monkeypatch):
    seed = int.from_bytes(os.urandom(4), "little")
    out, log = tmp_path / "run", tmp_path / "child.log"
    n = len(clean[kind.name][1])
    # after the first unit the child still sleeps (n - 1) * pause: a delay up to half that lands mid-run
    delay = random.Random(seed).uniform(0, (n - 1) * kind.pause / 2)
    pid = _fork(lambda: kind.run(tiny, out), log, lambda: _journal_records(tmp_path / "journal", kind.pause))
    assert _status(pid, log, until=lambda: len(_units(out)) >= 1) is None, log.read_text()[-2000:]
    time.sleep(delay)
    _kill(pid, log)
    _resume_and_check(kind, tiny, out, clean, monkeypatch, pid, f"random kill {delay:.3f} s after the first "
                                                                f"unit (seed {seed})")


@pytest.mark.parametrize("kind", KINDS)
def test_killed_mid_row_of_the_shard_file_then_resumed(kind, tiny, clean, tmp_path, monkeypatch):
    """The child dies with three rows in its shard file and half of the 4th: the rerun keeps the three
    rows byte for byte, cuts the torn one off and computes its unit again."""
    out, log = tmp_path / "run", tmp_path / "child.log"
    pid = _fork(lambda: kind.run(tiny, out), log, lambda: (_journal_records(tmp_path / "journal"),
                                                           _die_mid_row(SHARD_FILE, 4)))
    _assert_killed(_status(pid, log), log)
    data = (out / SHARD_FILE).read_bytes()
    assert data.count(b"\n") == 3 and not data.endswith(b"\n")  # three rows, then half of the fourth
    kept = data[: data.rfind(b"\n") + 1]
    assert len(_units(out)) == len(_finished(tmp_path / "journal")) == 3  # the torn row is skipped, not an error
    temps = _resume_and_check(kind, tiny, out, clean, monkeypatch, pid, "killed in the middle of the 4th row")
    assert temps == []  # appending rows leaves no temporary file
    again = (out / SHARD_FILE).read_bytes()
    assert again.startswith(kept)  # the rows before the kill, byte for byte; the torn half is gone
    after = [json.loads(line)["unit"] for line in again[len(kept):].splitlines()]
    assert len(after) == len(set(after)) == len(clean[kind.name][1]) - 3  # each missing unit once, the torn one too


def test_killed_inside_a_trace_file_write_then_resumed(tiny, clean, tmp_path, monkeypatch):
    """The child dies with trace 2 written in full to its temporary file, not yet renamed or recorded."""
    out, log = tmp_path / "run", tmp_path / "child.log"
    final = lambda path: fnmatch.fnmatch(path.name, "trace-*.parquet")  # noqa: E731 - not the temporary files
    pid = _fork(lambda: TRACES.run(tiny, out), log, lambda: (_journal_records(tmp_path / "journal"),
                                                             _die_before_rename(final, 3)))
    _assert_killed(_status(pid, log), log)
    assert len(_units(out)) == len(_finished(tmp_path / "journal")) == 2 and not (out / "traces" / "trace-00002.parquet").exists()
    temps = _resume_and_check(TRACES, tiny, out, clean, monkeypatch, pid, "killed before trace 2's rename")
    assert [str(p.relative_to(out)) for p in temps] == [f"traces/.trace-00002.{pid}.tmp.parquet"]



# ----- evaluations: a row torn by the kill ------------------------------------------------------------
def _evaluate(model, out: Path):
    problems = [lp.evals.Problem(id=f"q{i}", problem=q, answer=str(i)) for i, q in enumerate(QUESTIONS[:4])]
    return lp.evaluate(model, problems, "w/o,w/ Mless", out=out, max_new_tokens=5, batch_size=1, progress=False,
                       model_name="tiny")


def test_an_evaluation_killed_mid_row_keeps_its_rows_and_resumes(tiny, tmp_path):
    """The kill leaves half a row at the end of the results file: readers skip it, the rerun cuts it off,
    keeps the rows before it byte for byte, writes each missing row once and equals an uninterrupted run."""
    out, log, rows_file = tmp_path / "run", tmp_path / "child.log", "results-rank0.jsonl"
    clean = _evaluate(tiny, tmp_path / "clean")

    def key(row) -> tuple:
        return row["condition"], row["problem_id"], row["sample"]

    def stable(row) -> dict:
        return {k: v for k, v in row.items() if k not in ("seconds", "rank")}

    want = {key(r): stable(r) for r in read_rows(tmp_path / "clean")}
    pid = _fork(lambda: _evaluate(tiny, out), log, lambda: _die_mid_row(rows_file, 4))
    _assert_killed(_status(pid, log), log)
    data = (out / rows_file).read_bytes()
    assert data.count(b"\n") == 3 and not data.endswith(b"\n")  # three rows, then half of the fourth
    kept = data[: data.rfind(b"\n") + 1]
    before = read_rows(out)  # the torn row is skipped, not an error
    assert len(before) == 3 and all(stable(r) == want[key(r)] for r in before)
    resumed = _evaluate(tiny, out)
    again = (out / rows_file).read_bytes()
    assert again.startswith(kept)  # the rows before the kill, byte for byte; the torn half is gone
    after = [json.loads(line) for line in again[len(kept):].splitlines()]
    assert sorted(map(key, after)) == sorted(set(want) - {key(r) for r in before})  # each missing row, once
    volatile = ["seconds", "rank"]
    assert resumed.drop(columns=volatile).equals(clean.drop(columns=volatile))

# ----- lensprobe attribute: whole files or none ---------------------------------------------------------
ATTRIBUTE = ["attribute", "--model", "tiny", "--verify", "2"]
OLD = [*ATTRIBUTE, "--question", "What is 3+4?"]
NEW = [*ATTRIBUTE, "--question", "What is 12*7?"]
RESULTS = ("attribution.csv", "attribution.json", "verification.csv", "attribution_heatmap.html",
           "attribution_scatter.html")


def _files(out: Path) -> dict[str, bytes]:
    """Every file of a command's folder but the killed run's temporary ones, by name; figures with
    plotly's random element ids blanked (a page drawn twice differs only there)."""
    return {p.name: UUID.sub(b"<id>", p.read_bytes()) for p in out.iterdir()
            if p.is_file() and not fnmatch.fnmatch(p.name, ".*.tmp*")}


def _attribute(argv: list[str], out: Path) -> None:
    assert main([*argv, "--out", str(out)]) == 0


def _check_whole_files(out: Path, old: dict[str, bytes], new: dict[str, bytes], pid: int, note: str) -> int:
    """After a kill: every file is the old run's or the new run's, whole; returns how many are the new run's."""
    now = _files(out)
    assert set(now) <= set(old) | set(new) | {FOLDER_LOCK}, note
    assert set(old) - {FOLDER_LOCK} <= set(now), f"a file of the previous run is gone ({note})"
    torn = [name for name, data in now.items() if name != FOLDER_LOCK and data not in (old[name], new[name])]
    assert not torn, f"half-written or foreign files after the kill ({note}): {torn}"
    _leftovers(out, lambda rel: rel.name in old or rel.name == FOLDER_LOCK, pid)
    return sum(now[name] == new[name] != old[name] for name in now if name != FOLDER_LOCK)


def _rerun_writes_the_new_files(out: Path, new: dict[str, bytes], pid: int) -> None:
    _attribute(NEW, out)
    assert _files(out) == new  # the stale folder lock was taken over, then released
    temps = _leftovers(out, lambda rel: rel.name in new, pid)
    assert not {p.name for p in temps} & set(json.loads((out / ".lensprobe-files.json").read_text())["files"])


@pytest.fixture
def attribute_runs(tiny, tmp_path, monkeypatch):
    """A folder after a complete ``lensprobe attribute`` run (``old``), the files a second run with another
    question writes over it (``new``), the names that run renames into place in order, and its duration."""
    monkeypatch.setattr("lensprobe.app.commands.attribution.load_cli_model", lambda args: tiny)
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    _attribute(OLD, old_dir)
    shutil.copytree(old_dir, new_dir)
    renames: list[str] = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (renames.append(Path(dst).name), real(src, dst))[1])
    start = time.monotonic()
    _attribute(NEW, new_dir)
    took = time.monotonic() - start
    monkeypatch.setattr(os, "replace", real)
    old, new = _files(old_dir), _files(new_dir)
    assert set(RESULTS) <= set(old) == set(new) and all(old[name] != new[name] for name in RESULTS)
    assert set(RESULTS) <= set(renames)
    return old_dir, old, new, renames, took


def test_attribute_killed_before_each_rename_leaves_whole_files(attribute_runs, tmp_path):
    old_dir, old, new, renames, _ = attribute_runs
    for k in range(1, len(renames) + 1):  # dies with the k-th file written in full, not yet renamed
        out, log = tmp_path / f"before-rename-{k}", tmp_path / f"child-{k}.log"
        shutil.copytree(old_dir, out)
        pid = _fork(lambda out=out: _attribute(NEW, out), log,
                    lambda out=out, k=k: _die_before_rename(lambda p, out=out: p.parent == out, k))
        _assert_killed(_status(pid, log), log)
        note = f"killed before rename {k} ({renames[k - 1]})"
        assert _check_whole_files(out, old, new, pid, note) == k - 1, note
        assert len(_leftovers(out, lambda rel: rel.name in old or rel.name == FOLDER_LOCK, pid)) == 1, note
        _rerun_writes_the_new_files(out, new, pid)


def test_attribute_killed_at_random_times_leaves_whole_files(attribute_runs, tmp_path):
    old_dir, old, new, _, took = attribute_runs
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    for i in range(3):
        out, log = tmp_path / f"random-{i}", tmp_path / f"random-{i}.log"
        shutil.copytree(old_dir, out)
        delay = rng.uniform(0, took / 2)  # the child is a copy of this process: it takes about as long
        pid = _fork(lambda out=out: _attribute(NEW, out), log)
        time.sleep(delay)
        _kill(pid, log)
        note = f"random kill {delay:.3f} s after the start (seed {seed})"
        _check_whole_files(out, old, new, pid, note)
        _rerun_writes_the_new_files(out, new, pid)
