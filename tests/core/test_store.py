"""The results store (lensprobe.core.store, lensprobe.core.rowfiles): the settings diff, the one wait, row
files merged across ranks; every kind of run refuses another run's folder the same way."""

import json

import pytest

import lensprobe as lp
from lensprobe.core.rowfiles import RowWriter, read_row_files
from lensprobe.core.store import (
    ShardStore,
    diff_lines,
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
