"""Edges of sharded runs (lensprobe.core.storage.shards): the launcher's variables, the shard checks, the
local GPU on a CPU-only machine, run_sharded's orders and refusals, and the rank files read by rank
number; no model is loaded."""

import os
import re
import socket

import pytest
from test_shards import SHARD_VARS
from test_store_edges import Clock

import lensprobe as lp
import lensprobe.core.storage.shards as shards
from lensprobe.core.storage import store as storage
from lensprobe.core.storage.rowfiles import read_row_file, row_line
from lensprobe.core.storage.shards import (
    ShardStore,
    bind_local_gpu,
    check_shard,
    my_units,
    run_sharded,
    shard_info,
)


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    for var in (*SHARD_VARS, "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)


def test_the_launchers_variables_are_read_in_order_and_only_in_pairs(monkeypatch):
    """torchrun's pair wins over Open MPI's, which wins over MPICH's; a rank without its size is not read."""
    assert shard_info() == (0, 1)
    monkeypatch.setenv("PMI_RANK", "3")
    monkeypatch.setenv("PMI_SIZE", "4")
    assert shard_info() == (3, 4)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert shard_info() == (1, 2)
    monkeypatch.setenv("RANK", "5")  # no WORLD_SIZE: the next pair
    assert shard_info() == (1, 2)
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert shard_info() == (5, 8)
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(lp.LensprobeError, match=r"^RANK='5' / WORLD_SIZE='two' are not integers: unset them, or "
                                                r"start the processes with a launcher such as torchrun\.$"):
        shard_info()


def test_check_shard_fills_what_is_not_given_from_the_environment_and_needs_a_folder_when_sharded(monkeypatch):
    """A rank or world size not given comes from the launcher; a sharded run without a folder is refused."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert check_shard(None, None, "out") == (1, 3)
    assert check_shard(2, None, "out") == (2, 3)
    assert check_shard(None, 4, "out") == (1, 4)
    assert check_shard(0, 1, None) == (0, 1)
    with pytest.raises(lp.LensprobeError, match=r"^a sharded run \(world size 3\) needs an output folder \(out=\.\.\.\) "
                                                r"on a filesystem every process shares: the processes' results meet "
                                                r"there\.$"):
        check_shard(None, None, None)


@pytest.mark.parametrize(("rank", "world"), [(-1, 2), (2, 2), (0, 0), (True, 2), (0, True), (0, 2.0), (0.0, 2)])
def test_a_bad_shard_is_refused(rank, world):
    """A rank outside 0 .. world_size - 1, a world size below 1, or a rank or size that is not an int (a bool,
    a float) is refused."""
    check = shards._check_rank if isinstance(rank, float) or isinstance(world, float) else check_shard
    with pytest.raises(lp.LensprobeError, match=rf"^bad shard: rank {rank} of world size {world}; need 0 <= rank < "
                                                r"world_size\.$"):
        check(rank, world, *(("out",) if check is check_shard else ()))


def test_my_units_of_the_last_rank():
    """The last rank takes every world_size-th unit from its own index."""
    assert my_units(["a", "b", "c", "d", "e"], 1, 2) == ["b", "d"]
    assert my_units(("a", "b", "c"), 2, 3) == ["c"]


def test_no_gpu_is_bound_on_a_cpu_only_machine(monkeypatch):
    """Without LOCAL_RANK, with one that is not a number, or with one but no GPU, nothing is bound."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU-only machine, on any machine
    assert bind_local_gpu() is None
    for local in ("1", "x"):
        monkeypatch.setenv("LOCAL_RANK", local)
        assert bind_local_gpu() is None


def test_run_sharded_refuses_units_named_twice_and_keeps_the_units_order(tmp_path):
    """Units named twice are refused; in memory or in a folder the results come in the order of the units."""
    with pytest.raises(lp.LensprobeError, match=r"^unit names must be unique: name each unit of work once\.$"):
        run_sharded(["a", "b", "a"], len, out=None, kind="demo", settings={})
    units = ["ccc", "a", "bb"]
    assert list(run_sharded(units, len, out=None, kind="demo", settings={}).items()) == [("ccc", 3), ("a", 1),
                                                                                         ("bb", 2)]
    got = run_sharded(units, lambda u: [len(u), (u,)], out=tmp_path, kind="demo", settings={}, progress="n")
    assert list(got.items()) == [("ccc", [3, ["ccc"]]), ("a", [1, ["a"]]), ("bb", [2, ["bb"]])]


def test_the_ranks_of_a_two_process_run_return_their_share_then_everything(tmp_path):
    """Rank 1 computes and returns units 1 and 3 only; rank 0 then computes 0 and 2 and returns all four."""
    units = ["u0", "u1", "u2", "u3"]
    calls = []

    def compute(u):
        calls.append(u)
        return int(u[1]) * 10

    assert run_sharded(units, compute, out=tmp_path, kind="demo", settings={}, rank=1, world_size=2,
                       stall_timeout=5) == {"u1": 10, "u3": 30}
    got = run_sharded(units, compute, out=tmp_path, kind="demo", settings={}, rank=0, world_size=2, stall_timeout=5)
    assert list(got.items()) == [("u0", 0), ("u1", 10), ("u2", 20), ("u3", 30)] and calls == ["u1", "u3", "u0", "u2"]


def test_rank_files_are_merged_by_rank_number_and_other_names_are_ignored(tmp_path):
    """shard-rank10 comes after shard-rank2 (the first complete row wins); shard-rankx.jsonl is not a rank."""
    with ShardStore(tmp_path, "demo", {}, rank=0) as store:
        run = store.config["hash"]
    (tmp_path / "shard-rank2.jsonl").write_text(row_line({"unit": "a", "result": 2, "run": run}), encoding="utf-8")
    (tmp_path / "shard-rank10.jsonl").write_text(row_line({"unit": "a", "result": 10, "run": run}), encoding="utf-8")
    (tmp_path / "shard-rankx.jsonl").write_text("not json\n", encoding="utf-8")
    with ShardStore(tmp_path, "demo", {}, rank=0) as store, pytest.raises(
            lp.LensprobeError, match=r"two results for 'a' disagree: .*shard-rank2\.jsonl unit 'a' \(line 1\) and "
                                     r".*shard-rank10\.jsonl unit 'a' \(line 1\)"):
        store.done()


@pytest.mark.parametrize("row", [{"unit": 1, "result": 1}, {"unit": "a"}])
def test_a_row_that_is_not_a_finished_unit_is_refused(tmp_path, row):
    """A row that has no text unit or no result is refused with its line and the fix (one that is not a mapping
    has no digest: refused before)."""
    with ShardStore(tmp_path, "demo", {}, rank=0) as store:
        store.record("ok", 1)
    with open(tmp_path / "shard-rank0.jsonl", "a", encoding="utf-8") as fh:
        fh.write(row_line(row))
    with ShardStore(tmp_path, "demo", {}, rank=0) as store, pytest.raises(
            lp.LensprobeError, match=r"shard-rank0\.jsonl line 2 is not a finished unit \(\{\"unit\": \.\.\., "
                                     r"\"result\": \.\.\.\}\): the file was edited or damaged; delete that line to "
                                     r"compute its unit again\.$"):
        store.done()


def test_a_rank_is_held_by_one_store_until_closed_and_its_file_made_at_the_first_unit(tmp_path):
    """A second store of the same rank is refused while the first is open; the rank file appears only when a
    unit is recorded; after close the rank can be opened again."""
    store = ShardStore(tmp_path, "demo", {}, rank=3)
    with pytest.raises(lp.LensprobeError, match=r"^rank 3 of .* is being run by another process \(.*\): wait for it, "
                                                r"or give each process its own rank"):
        ShardStore(tmp_path, "demo", {}, rank=3)
    assert not (tmp_path / "shard-rank3.jsonl").exists()
    assert store.record("t", (1, 2)) == [1, 2]
    store.close()
    assert [row for _, row in read_row_file(tmp_path / "shard-rank3.jsonl")] == [
        {"unit": "t", "result": [1, 2], "run": store.config["hash"], "ids": None}]
    with ShardStore(tmp_path, "demo", {}, rank=3) as again:
        assert again.wait(["t"], 4, stall_timeout=1) == {"t": [1, 2]}


def test_the_local_rank_picks_a_gpu_modulo_the_gpus_there_are(monkeypatch):
    """LOCAL_RANK=3 on a machine with 2 GPUs binds GPU 1 (3 % 2), and says so (the GPUs faked here)."""
    import torch

    bound = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert bind_local_gpu() == 1 and bound == [1]
    monkeypatch.setenv("LOCAL_RANK", "-1")  # not a number of digits: left alone
    assert bind_local_gpu() is None and bound == [1]



@pytest.mark.parametrize("sharded", [False, True])
def test_the_progress_bar_is_off_by_default_and_labelled_units_or_as_asked(tmp_path, capsys, sharded):
    """tqdm writes its bar to stderr: nothing without progress=..., 'units' for progress=True, the text given
    otherwise, counting in units; in memory over the 4 units, or as rank 1 of 2 in a new folder (u1 and u3, the rank named)."""
    units = ["u0", "u1", "u2", "u3"]

    def bar(folder, **progress):
        shard = dict(out=tmp_path / folder, rank=1, world_size=2) if sharded else dict(out=None)
        run_sharded(units, len, kind="demo", settings={}, **shard, **progress)
        return capsys.readouterr().err

    suffix, count = (" (rank 1/2)", "2/2") if sharded else ("", "4/4")
    assert bar("a") == ""
    for folder, progress, label in (("b", True, "units"), ("c", "sizes", "sizes")):
        err = bar(folder, progress=progress)
        # and the rate in units: "[00:00<00:00, 2.1e+03unit/s]" ("?unit/s" before a rate, "s/unit" when slow)
        assert re.search(rf"(^|\r){re.escape(label + suffix)}: 100%\|.*\| {count} \[[^]]*(unit/s|s/unit)\]", err), err


def test_a_store_waits_in_its_folder_with_the_limit_and_the_poll_it_is_given(tmp_path, monkeypatch):
    """ShardStore.wait passes its folder, stall limit and poll on: looks every 0.25 s, gives up after more than
    0.75 s without news (the look at 1 s), naming its folder and that limit, not the environment's 5 s."""
    clock = Clock()  # test_store_edges' clock: sleep moves it on, nothing sleeps
    monkeypatch.setattr(storage, "time", clock)
    monkeypatch.setenv(storage.STALL_TIMEOUT_VAR, "5")
    expected = (f"gave up waiting in {tmp_path}: rank 1 of 2 did not finish 1 unit(s) (e.g. 'u1') and nothing "
                "finished for 0.75 s. Check that process's output, then rerun the same command: it resumes where "
                "the ranks stopped (every finished unit is saved).")
    with ShardStore(tmp_path, "demo", {}, rank=0) as store:
        store.record("u0", 0)
        with pytest.raises(lp.LensprobeError, match=f"^{re.escape(expected)}$"):
            store.wait(["u0", "u1"], 2, stall_timeout=0.75, poll=0.25)
    assert clock.sleeps == [0.25] * 4 and clock.now == 1.0


def test_a_store_names_every_old_file_and_says_how_to_start_over(tmp_path):
    """Shard files of the older format are listed, all of them, in the whole message with its fix."""
    with ShardStore(tmp_path, "demo", {}, rank=0) as store:
        store.record("a", 1)
    for rank in (2, 1):
        (tmp_path / f"shard-rank{rank}.json").write_text("{}")
    expected = (f"{tmp_path} holds shard files of an older format (shard-rank1.json, shard-rank2.json; finished units "
                "are now rows of shard-rank{R}.jsonl), which lensprobe no longer reads. Rerun into a new output "
                "folder (or delete this one to start over).")
    with pytest.raises(lp.LensprobeError, match=f"^{re.escape(expected)}$"):
        ShardStore(tmp_path, "demo", {}, rank=0)


def test_rank_files_without_the_runs_settings_are_refused_not_resumed(tmp_path):
    """A folder holding a rank's rows but no config.json: whose rows they are cannot be checked, so the store
    refuses it (the rows are not counted as done), naming the file and both ways out."""
    (tmp_path / "shard-rank3.jsonl").write_text('{"unit": "u", "result": 1}\n')
    expected = (f"{tmp_path} holds result rows (shard-rank3.jsonl line 1, ...) but no config.json: the run they "
                "belong to cannot be checked, so they are neither counted nor resumed. Use a new output folder, or delete "
                "this one (or move the shard-rank*.jsonl files away) to start over.")
    assert "copy" not in expected  # a copy of another run's config.json would adopt its rows
    with pytest.raises(lp.LensprobeError, match=f"^{re.escape(expected)}$"):
        ShardStore(tmp_path, "demo", {}, rank=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-rank3.jsonl"]


def test_two_results_for_a_unit_name_their_lines_and_the_whole_fix(tmp_path):
    with ShardStore(tmp_path, "demo", {}, rank=0) as r0, ShardStore(tmp_path, "demo", {}, rank=1) as r1:
        r0.record("u0", 1.0)
        r1.record("u0", 1.5)
        expected = (f"two results for 'u0' disagree: {tmp_path}/shard-rank0.jsonl unit 'u0' (line 1) and "
                    f"{tmp_path}/shard-rank1.jsonl unit 'u0' (line 1). Which one is right cannot be told from the "
                    "files: delete that unit's line from one of the files (or delete the file), then rerun (it "
                    "computes the key again if needed).")
        with pytest.raises(lp.LensprobeError, match=f"^{re.escape(expected)}$"):
            r0.done()


def test_a_store_is_rank_0_by_default_and_records_under_its_rank_lock_alone(tmp_path):
    """Without rank=..., the store is rank 0 (its lock, its file); recording opens no second lock beside the
    rank's (the row writer is told the rank lock covers its file), and a second rank-0 store is refused with
    the whole message."""
    with ShardStore(tmp_path, "demo", {}) as store:
        store.record("a", 1)
        assert sorted(p.name for p in tmp_path.iterdir()) == [".shard-rank0.lock", "config.json", "shard-rank0.jsonl"]
        expected = (f"rank 0 of {tmp_path} is being run by another process (pid {os.getpid()} on host "
                    f"{socket.gethostname()}): wait for it, or give each process its own rank (start them with a "
                    "launcher such as torchrun).")
        with pytest.raises(lp.LensprobeError, match=f"^{re.escape(expected)}$"):
            ShardStore(tmp_path, "demo", {}, rank=0)


def test_rank_0_waits_with_the_stall_limit_run_sharded_is_given(tmp_path, monkeypatch):
    """run_sharded passes its stall_timeout on to rank 0's wait: with rank 1 silent, it gives up after 0.75 s
    without news (the environment says 5 s), on a clock where nothing sleeps."""
    clock = Clock()
    monkeypatch.setattr(storage, "time", clock)
    monkeypatch.setenv(storage.STALL_TIMEOUT_VAR, "5")
    with pytest.raises(lp.LensprobeError, match=r"rank 1 of 2 did not finish 1 unit\(s\) \(e\.g\. 'u1'\) and nothing "
                                                r"finished for 0\.75 s\."):
        run_sharded(["u0", "u1"], len, out=tmp_path, kind="demo", settings={}, rank=0, world_size=2,
                    stall_timeout=0.75)
    assert clock.now <= 2.0


def test_a_run_of_one_process_in_a_folder_shows_no_rank_on_its_bar(tmp_path, capsys):
    """world_size 1 with a folder: the bar is labelled as asked, without "(rank 0/1)"."""
    assert run_sharded(["u0", "u1"], len, out=tmp_path, kind="demo", settings={}, rank=0, world_size=1,
                       progress="sizes") == {"u0": 2, "u1": 2}
    assert re.search(r"(^|\r)sizes: 100%\|.*\| 2/2 ", capsys.readouterr().err)
