"""The one lock of lensprobe (lensprobe.core.storage.locks): held, released, stale after SIGKILL, other hosts;
used by sharded runs (ShardStore) and evaluation results files (RowWriter)."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import lensprobe as lp
from lensprobe.core.storage.locks import FileLock, lock_holder, pid_alive
from lensprobe.core.storage.rowfiles import read_row_files
from lensprobe.core.storage.shards import ShardStore
from lensprobe.evals.results.folder import RowWriter

BUSY = "the thing is in use ({holder}): wait for it."


def dead_pid() -> int:
    """A pid no process can have: one above the kernel's maximum."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def test_a_held_lock_names_its_holder_and_is_deleted_on_release(tmp_path):
    path = tmp_path / ".x.lock"
    with FileLock(path, busy=BUSY):
        assert lock_holder(path)["pid"] == os.getpid() and lock_holder(path)["host"] == socket.gethostname()
        with pytest.raises(lp.LensprobeError, match=rf"the thing is in use \(pid {os.getpid()} on host "):
            FileLock(path, busy=BUSY).acquire()
    assert not path.exists() and lock_holder(path) is None
    FileLock(path, busy=BUSY).acquire().release()  # free again


def test_a_stale_lock_of_this_host_is_taken_over_with_a_warning(tmp_path, caplog):
    path = tmp_path / ".x.lock"
    pid = dead_pid()
    assert not pid_alive(pid) and pid_alive(os.getpid())
    path.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "since": "earlier"}))
    with caplog.at_level(logging.WARNING, logger="lensprobe.core.storage.locks"), FileLock(path, busy=BUSY):
        assert lock_holder(path)["pid"] == os.getpid()
    assert f"took over a stale lock left by pid {pid} on host {socket.gethostname()}" in caplog.text


def test_a_lock_of_another_host_is_refused_with_the_file_to_delete(tmp_path):
    path = tmp_path / ".x.lock"
    path.write_text(json.dumps({"pid": 12, "host": "elsewhere-node", "since": "earlier"}))
    with pytest.raises(lp.LensprobeError, match=r"pid 12 on host elsewhere-node.*delete .*\.x\.lock and retry"):
        FileLock(path, busy=BUSY).acquire()
    assert lock_holder(path)["host"] == "elsewhere-node"  # left as it was


def test_shards_and_results_files_use_the_same_lock(tmp_path):
    with ShardStore(tmp_path / "sweep", "demo", {}, rank=0):
        held = tmp_path / "sweep" / ".shard-rank0.lock"
        assert lock_holder(held)["pid"] == os.getpid()
    with RowWriter(tmp_path / "results-rank0.jsonl"):
        assert lock_holder(tmp_path / ".results-rank0.jsonl.lock")["pid"] == os.getpid()
    assert not held.exists() and not (tmp_path / ".results-rank0.jsonl.lock").exists()


HOLDER_SCRIPT = """
import sys, time
from lensprobe.core.storage.shards import ShardStore
from lensprobe.evals.results.folder import RowWriter
store = ShardStore(sys.argv[1], "demo", {}, rank=0)
store.record("u0", 1)
writer = RowWriter(sys.argv[2])
writer.write({"condition": "w/o", "problem_id": "q0", "sample": 0})
writer.sync()
print("ready", flush=True)
time.sleep(120)
"""


@pytest.mark.slow  # launches a process
def test_locks_left_by_a_process_killed_with_sigkill_are_taken_over(tmp_path, caplog):
    shards, results = tmp_path / "shards", tmp_path / "evals" / "results-rank0.jsonl"
    results.parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER_SCRIPT, str(shards), str(results)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        with pytest.raises(lp.LensprobeError, match=rf"rank 0 of .* is being run by another process \(pid {proc.pid} "):
            ShardStore(shards, "demo", {}, rank=0)
        with pytest.raises(lp.LensprobeError, match=rf"being written by another process \(pid {proc.pid} "):
            RowWriter(results)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert lock_holder(shards / ".shard-rank0.lock")["pid"] == proc.pid  # the lock files outlive it
    with caplog.at_level(logging.WARNING, logger="lensprobe.core.storage.locks"):
        with ShardStore(shards, "demo", {}, rank=0) as store:
            assert store.done() == {"u0": 1}
        with RowWriter(results) as writer:
            writer.write({"condition": "w/o", "problem_id": "q1", "sample": 0})
    assert caplog.text.count(f"took over a stale lock left by pid {proc.pid} on host {socket.gethostname()}") == 2
    assert [r["problem_id"] for _, _, r in read_row_files(results.parent, "results-rank*.jsonl")] == ["q0", "q1"]


@pytest.mark.parametrize("rows_left", [0, 1])
def test_a_resumed_rank_takes_over_its_stale_results_lock_with_one_warning(tiny, tmp_path, caplog, rows_left):
    """A rank killed after its last row left its lock: the resume takes it over (and says so once) even
    when that rank has nothing left to compute, so a finished run leaves no lock file."""
    problems = [lp.evals.Problem(id=f"q{i}", problem=f"What is {i}+1?", answer=str(i + 1)) for i in range(4)]
    out = tmp_path / "run"

    def run():
        return lp.evaluate(tiny, problems, "w/o", out=out, max_new_tokens=2, progress=False, rank=1, world_size=2,
                           model_name="tiny")

    run()
    results = out / "results-rank1.jsonl"
    if rows_left:
        results.write_text("".join(results.read_text().splitlines(keepends=True)[:-rows_left]))
    lock, pid = out / ".results-rank1.jsonl.lock", dead_pid()
    lock.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "since": "earlier"}))
    with caplog.at_level(logging.WARNING, logger="lensprobe.core.storage.locks"):
        assert len(run()) == 2  # rank 1's share: q1, q3
    assert caplog.text.count(f"took over a stale lock left by pid {pid}") == 1, caplog.text
    assert not lock.exists()


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_lock_file_that_is_not_a_file_is_refused_at_once(tmp_path, kind):
    path = tmp_path / ".rank0.lock"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    signal.alarm(60)  # a guard: a read that blocks would otherwise hang the suite
    try:
        with pytest.raises(lp.LensprobeError, match=rf"lock file {path} is not a regular file.*delete it"):
            FileLock(path).acquire()
        with pytest.raises(lp.LensprobeError, match="not a regular file"):
            lock_holder(path)
    finally:
        signal.alarm(0)
