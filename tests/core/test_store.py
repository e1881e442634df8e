"""The results store (lensprobe.core.storage.store, lensprobe.core.storage.rowfiles): the settings diff, the one wait, row
files merged across ranks; every kind of run refuses another run's folder the same way."""

import json
from pathlib import Path

import pytest

import lensprobe as lp
from lensprobe.core.storage.rowfiles import RowWriter, read_row_file, read_row_files, row_line
from lensprobe.core.storage.shards import ShardStore, run_sharded
from lensprobe.core.storage.store import (
    diff_lines,
    merge_rows,
    open_folder,
    other_run_error,
    read_json,
    settings_diff,
    wait_for_units,
)


def test_settings_diff_names_every_nested_setting_that_differs():
    old = {"model": {"name": "a", "n_layers": 2}, "seed": 0, "gone": 1}
    new = {"model": {"name": "b", "n_layers": 2}, "seed": 0, "added": [1]}
    diff = settings_diff(old, new)
    assert diff == [(("added",), "<missing>", [1]), (("gone",), 1, "<missing>"), (("model", "name"), "a", "b")]
    assert diff_lines(diff)[2] == "model.name: folder has 'a', this run has 'b'"
    assert settings_diff(old, json.loads(json.dumps(old))) == []
    err = other_run_error("runs/x holds results of another run", diff_lines(diff))
    assert str(err).splitlines() == ["runs/x holds results of another run:",
                                     "  added: folder has '<missing>', this run has [1]",
                                     "  gone: folder has 1, this run has '<missing>'",
                                     "  model.name: folder has 'a', this run has 'b'",
                                     "Use a new output folder, or delete this one to start over."]
    assert str(other_run_error("runs/x holds a 'demo' run")) == ("runs/x holds a 'demo' run. Use a new output "
                                                                "folder, or delete this one to start over.")


def test_the_wait_returns_when_every_unit_is_in_and_raises_naming_the_ranks_when_stalled(tmp_path):
    looks = iter([(1, {"u0"}), (2, {"u0", "u1"}), (3, {"u0", "u1", "u2"})])
    assert wait_for_units(tmp_path, ["u0", "u1", "u2"], 3, lambda: next(looks), poll=0) == {"u0", "u1", "u2"}
    with pytest.raises(lp.LensprobeError, match=r"rank 1, rank 3 of 4 did not finish 3 problem\(s\) \(e.g. 'p1'\) "
                                                r"and nothing finished for 0.05 s\. .*rerun the same command"):
        wait_for_units(tmp_path, [f"p{i}" for i in range(6)], 4, lambda: (4, {"p0", "p2", "p4"}),
                       what="problem", stall_timeout=0.05, poll=0.01)


def test_the_stall_limit_comes_from_the_environment_when_set(tmp_path, monkeypatch):
    """LENSPROBE_STALL_TIMEOUT sets how long every wait lasts without news (the suite sets it short, so a
    merge bug fails instead of waiting an hour); unset, the limit is STALL_TIMEOUT; a bad value is refused."""
    from lensprobe.core.storage.store import STALL_TIMEOUT, STALL_TIMEOUT_VAR, stall_limit

    monkeypatch.delenv(STALL_TIMEOUT_VAR)
    assert stall_limit() == STALL_TIMEOUT == 3600
    monkeypatch.setenv(STALL_TIMEOUT_VAR, " 0.05 ")
    assert stall_limit() == 0.05
    with pytest.raises(lp.LensprobeError, match=r"nothing finished for 0.05 s"):
        wait_for_units(tmp_path, ["u0", "u1"], 2, lambda: (1, {"u0"}), poll=0.01)
    for bad in ("0", "-5", "an hour", "nan", "inf"):
        monkeypatch.setenv(STALL_TIMEOUT_VAR, bad)
        with pytest.raises(lp.LensprobeError, match=rf"LENSPROBE_STALL_TIMEOUT='{bad}' is not a positive number"):
            wait_for_units(tmp_path, ["u0"], 1, lambda: (0, set()), poll=0.01)


def test_folders_and_damaged_files_are_refused_with_the_fix(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(lp.LensprobeError, match="output folder .*notes.txt is a file: give a folder path"):
        open_folder(tmp_path / "notes.txt")
    with pytest.raises(lp.LensprobeError, match=r"cannot create the output folder .*notes.txt/run \(Not a directory"):
        ShardStore(tmp_path / "notes.txt" / "run", "demo", {})
    (tmp_path / "s.json").write_text('{"a": ')
    with pytest.raises(lp.LensprobeError, match=r"s.json is not valid JSON \(.*\): it was edited or damaged; fix it\."):
        read_json(tmp_path / "s.json", fix="fix it")


def test_row_files_of_every_rank_are_merged_and_a_row_cut_short_is_skipped(tmp_path):
    for rank in (1, 0):
        with RowWriter(tmp_path / f"results-rank{rank}.jsonl") as writer:
            writer.write({"rank": rank, "n": 0})
            writer.write({"rank": rank, "n": 1})
    with open(tmp_path / "results-rank1.jsonl", "ab") as fh:
        fh.write(b'{"rank": 1, "n": 2')  # a crash in the middle of a row
    merged = [(path.name, line, row["n"]) for path, line, row in read_row_files(tmp_path, "results-rank*.jsonl")]
    assert merged == [("results-rank0.jsonl", 1, 0), ("results-rank0.jsonl", 2, 1),
                      ("results-rank1.jsonl", 1, 0), ("results-rank1.jsonl", 2, 1)]
    with RowWriter(tmp_path / "results-rank1.jsonl") as writer:  # removed before new rows are appended
        writer.write({"rank": 1, "n": 3})
    assert [row["n"] for _, _, row in read_row_files(tmp_path, "results-rank1.jsonl")] == [0, 1, 3]


# ----------------------------------------------------------------------------- atomic side files
def sweep_result(value: float):
    import torch

    from lensprobe.experiments.sweep import SweepResult

    return SweepResult([(0, 0), (0, 1)], torch.tensor([1.0]), torch.tensor([[value, 2.0]]), "entropy", "zero", 1, 2)


def test_a_side_file_write_that_raises_midway_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    import pandas as pd

    path = sweep_result(1.5).to_csv(tmp_path / "sweep.csv")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) == {"sweep.csv", "sweep_long.csv"}

    def half_then_fail(self, target=None, *args, **kwargs):
        with open(target, "w", encoding="utf-8") as fh:
            fh.write("layer,0\n0,")  # part of a table, then the disk fills up
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        sweep_result(9.0).to_csv(path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_trace_save_that_raises_midway_leaves_the_old_trace(tiny, tmp_path, monkeypatch):
    trace = lp.trace_generation(tiny, lp.build_prompt(tiny, "What is 1+1?"), max_new_tokens=3)
    for name in ("t.json", "t.parquet"):
        trace.save(tmp_path / name)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    import pyarrow.parquet as pq

    def half_then_fail(table, where, *args, **kwargs):
        with open(where, "wb") as fh:
            fh.write(b"PAR1 half a file")
        raise OSError(5, "Input/output error")

    def text_half_then_fail(self, text, *args, **kwargs):
        with open(self, "w", encoding="utf-8") as fh:
            fh.write(text[: len(text) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", half_then_fail)
    with pytest.raises(OSError, match="Input/output error"):
        trace.save(tmp_path / "t.parquet")
    monkeypatch.setattr(Path, "write_text", text_half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        trace.save(tmp_path / "t.json")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


# ----------------------------------------------------------------------------- one merge rule
def test_merge_rule_first_complete_row_wins_and_disagreeing_rows_are_named():
    rows = [("f0 line 1", "a", {"v": 1, "ok": False}), ("f0 line 2", "b", {"v": 2, "ok": True}),
            ("f1 line 1", "a", {"v": 3, "ok": True}), ("f1 line 2", "a", {"v": 3, "ok": True}),
            ("f1 line 3", "b", {"v": 9, "ok": False})]
    merged = merge_rows(rows, complete=lambda r: r["ok"], agree=lambda x, y: x["v"] == y["v"])
    assert merged == {"a": {"v": 3, "ok": True}, "b": {"v": 2, "ok": True}}  # incomplete rows stand aside
    with pytest.raises(lp.LensprobeError, match=r"two results for 'b' disagree: f0 line 2 and f1 line 9\. Which one is "
                                                r"right cannot be told from the files: fix it, then rerun"):
        merge_rows([*rows, ("f1 line 9", "b", {"v": 4, "ok": True})], complete=lambda r: r["ok"],
                   agree=lambda x, y: x["v"] == y["v"], fix="fix it")


def test_two_ranks_files_holding_one_unit_with_different_results_are_refused_not_a_later_rank_wins(tmp_path):
    with ShardStore(tmp_path, "demo", {}, rank=0) as r0, ShardStore(tmp_path, "demo", {}, rank=1) as r1:
        r0.record("u0", 1.0)
        r1.record("u1", 2.0)
        r1.record("u0", 1.0)  # the same result twice: fine
        assert r0.done() == r1.done() == {"u0": 1.0, "u1": 2.0}
        r1.record("u0", 1.5)
        for store in (r0, r1):
            with pytest.raises(lp.LensprobeError, match=r"two results for 'u0' disagree: .*shard-rank0\.jsonl unit "
                                                        r"'u0' \(line 1\) and .*shard-rank1\.jsonl unit 'u0' \(line "
                                                        r"3\)\..*delete that unit's line from one of the files"):
                store.done()
        with pytest.raises(lp.LensprobeError, match="disagree"):
            run_sharded(["u0", "u1"], lambda u: 0.0, out=tmp_path, kind="demo", settings={}, rank=2, world_size=3)


# ----------------------------------------------------------------------------- resuming keeps every earlier unit
def test_a_reopened_shard_store_keeps_its_earlier_units(tmp_path):
    with ShardStore(tmp_path, "demo", {}, rank=0) as store:
        store.record("a", 1)
    with ShardStore(tmp_path, "demo", {}, rank=0) as store:
        store.record("b", 2)
        assert store.done() == {"a": 1, "b": 2}
    with ShardStore(tmp_path, "demo", {}, rank=0) as store:
        assert store.done() == {"a": 1, "b": 2}



def test_recording_units_appends_one_row_each_and_never_rewrites_earlier_ones(tmp_path):
    path = tmp_path / "shard-rank0.jsonl"
    with ShardStore(tmp_path, "demo", {}, rank=0) as store:
        assert store.record("u0", {"v": [1, 2]}) == {"v": [1, 2]}  # as read back from JSON
        first = path.read_bytes()
        sizes = [len(first)]
        for i in range(1, 6):
            store.record(f"u{i}", (i, i / 3))
            data = path.read_bytes()
            assert data.startswith(first) and len(data) > sizes[-1]  # earlier rows untouched, the file only grows
            sizes.append(len(data))
    rows = [row for _, row in read_row_file(path)]
    run = store.config["hash"]
    assert len(rows) == 6 and rows[0] == {"unit": "u0", "result": {"v": [1, 2]}, "run": run, "ids": None}
    assert rows[5] == {"unit": "u5", "result": [5, 5 / 3], "run": run, "ids": None}
    assert not (tmp_path / "shard-rank0.json").exists()


def test_a_row_torn_by_a_crash_is_skipped_then_cut_off_before_the_rank_appends_again(tmp_path):
    path = tmp_path / "shard-rank0.jsonl"
    with ShardStore(tmp_path, "demo", {}, rank=0) as store:
        store.record("a", 1)
    kept = path.read_bytes()
    path.write_bytes(kept + b'{"unit": "b", "res')  # the kill landed in the middle of the second row
    with ShardStore(tmp_path, "demo", {}, rank=0) as store:
        assert store.done() == {"a": 1}
        store.record("b", 2)
        assert store.done() == {"a": 1, "b": 2}
    assert path.read_bytes() == kept + row_line({"unit": "b", "result": 2, "run": store.config["hash"],
                                                 "ids": None}).encode()


def test_a_folder_with_shard_files_of_the_older_format_is_refused(tmp_path):
    with ShardStore(tmp_path, "demo", {}, rank=0) as store:
        store.record("a", 1)
    (tmp_path / "shard-rank1.json").write_text('{"rank": 1, "units": {"b": 2}}')
    with pytest.raises(lp.LensprobeError, match=r"holds shard files of an older format \(shard-rank1\.json;.*no longer "
                                                r"reads.*Rerun into a new output folder"):
        ShardStore(tmp_path, "demo", {}, rank=0)
    with pytest.raises(lp.LensprobeError, match="older format"):
        run_sharded(["a", "b"], len, out=tmp_path, kind="demo", settings={})

def test_done_over_several_ranks_files_returns_every_ranks_units(tmp_path):
    for rank, units in ((0, {"a": 1, "c": 3}), (1, {"b": 2}), (2, {"d": 4})):
        with ShardStore(tmp_path, "demo", {}, rank=rank) as store:
            for unit, value in units.items():
                store.record(unit, value)
    for rank in (0, 1, 2, 3):  # reopened by each rank (and by a rank with no file yet)
        with ShardStore(tmp_path, "demo", {}, rank=rank) as store:
            assert store.done() == {"a": 1, "b": 2, "c": 3, "d": 4}
    calls = []
    got = run_sharded(["a", "b", "c", "d"], lambda u: calls.append(u), out=tmp_path, kind="demo", settings={})
    assert got == {"a": 1, "b": 2, "c": 3, "d": 4} and calls == []  # nothing computed again


def test_a_reopened_rows_file_keeps_its_earlier_rows(tmp_path):
    from lensprobe.evals.results.folder import prepare_folder, read_rows, results_file, settled_rows

    h1 = prepare_folder(tmp_path, {"x": 1}, {"w/o": {"hash": "c1"}})["hash"]

    def row(problem: str) -> dict:
        return {"condition": "w/o", "problem_id": problem, "sample": 0, "finish": "eos", "math-verify": True,
                "config_hash": h1, "condition_hash": "c1"}

    for rank, problems in ((0, ["a"]), (0, ["b"]), (1, ["c"])):  # rank 0 closes and reopens its file
        with RowWriter(results_file(tmp_path, rank)) as writer:
            for p in problems:
                writer.write(row(p))
    assert [r["problem_id"] for r in settled_rows(read_rows(tmp_path))] == ["a", "b", "c"]
