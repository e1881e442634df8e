"""Result folders under faults: a full disk during write or fsync stops the run with a clear error and
keeps every row it reports as saved; several folders in one report never count a row twice."""

import errno
import os
import re
import shutil

import pytest

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.evals import Problem
from lensprobe.evals.results.folder import (
    DuplicateRowsWarning,
    RowWriter,
    load_many_results,
    prepare_folder,
    read_rows,
    results_file,
)
from lensprobe.evals.results.stats import summary_tables
from lensprobe.evals.running import execute as running

PROBLEMS = [Problem(id=f"q{i}", problem=f"What is {i}+{i}?", answer=str(2 * i), level=1, subject="S")
            for i in range(3)]
CONFIG = lp.EvalConfig(max_new_tokens=3, batch_size=2)
SAVED = re.compile(r"(\d+) row\(s\) of this run are safely on disk")


def is_results_file(fd: int) -> bool:
    return os.readlink(f"/proc/self/fd/{fd}").endswith(".jsonl")


def run(tiny, out):
    return lp.evaluate(tiny, PROBLEMS, "w/o", out=out, config=CONFIG, model_name="tiny", progress=False)


def test_fsync_failing_with_a_full_disk_stops_the_run_and_rerun_resumes(tiny, tmp_path, monkeypatch):
    real_fsync, calls = os.fsync, []

    def fsync(fd):
        if is_results_file(fd):
            calls.append(fd)
            if len(calls) == 3:  # the third row's sync (each row is synced as it is written)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(lp.LensprobeError, match=r"saving \(fsync\) .*results-rank0\.jsonl failed \(No space left on "
                                                r"device\): 2 row\(s\) of this run are safely on disk") as info:
        run(tiny, tmp_path)
    saved = int(SAVED.search(str(info.value)).group(1))
    rows = read_rows(tmp_path)
    assert saved == 2 and len(rows) >= saved  # every row reported saved is there, whole
    assert {r["problem_id"] for r in rows} <= {"q0", "q1", "q2"}
    monkeypatch.setattr(os, "fsync", real_fsync)
    resumed = run(tiny, tmp_path)
    assert sorted(resumed["problem_id"]) == ["q0", "q1", "q2"]
    assert len(read_rows(tmp_path)) == 3


def test_a_write_cut_short_by_a_full_disk_leaves_only_whole_rows(tiny, tmp_path, monkeypatch):
    real_write, calls = os.write, []

    def write(fd, data):
        if not is_results_file(fd):
            return real_write(fd, data)
        calls.append(len(data))
        if len(calls) == 2:  # the second row: half of it fits on the disk ...
            return real_write(fd, bytes(data[: len(data) // 2]))
        if len(calls) == 3:  # ... then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(lp.LensprobeError, match="writing to .*results-rank0.jsonl failed \\(No space left") as info:
        run(tiny, tmp_path)
    monkeypatch.setattr(os, "write", real_write)
    assert int(SAVED.search(str(info.value)).group(1)) == 1
    data = results_file(tmp_path, 0).read_bytes()
    assert data.endswith(b"\n") and [r["problem_id"] for r in read_rows(tmp_path)] == ["q0"]
    assert len(run(tiny, tmp_path)) == 3 and len(read_rows(tmp_path)) == 3


def test_a_writer_refuses_to_go_on_after_a_failed_write(tmp_path, monkeypatch):
    writer = RowWriter(tmp_path / "results-rank0.jsonl")
    monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(lp.LensprobeError, match=r"failed \(I/O error\): 0 row\(s\)"):
        writer.write({"a": 1})
    monkeypatch.undo()
    with pytest.raises(lp.LensprobeError, match="had a write error earlier: rerun the command"):
        writer.write({"a": 2})
    writer.close()
    assert read_rows(tmp_path) == []


FOLDER_GONE = r"the output folder {} was deleted during the run: the \d+ row\(s\) written so far are lost with it"


def test_a_writer_notices_its_folder_deleted_at_the_next_row(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    writer = RowWriter(folder / "results-rank0.jsonl")
    writer.write({"a": 1})
    writer.sync()
    shutil.rmtree(folder)
    with pytest.raises(lp.LensprobeError, match=FOLDER_GONE.format(re.escape(str(folder))) + r"\. Rerun the command"):
        writer.write({"a": 2})
    writer.close()
    assert not folder.exists()  # nothing written into a new folder of the same name


def test_an_evaluation_stops_at_the_first_row_after_its_folder_is_deleted(tiny, tmp_path, monkeypatch):
    made = []

    def make_row(*args, **kwargs):  # the folder disappears once the first row is written
        if len(made) == 1:
            shutil.rmtree(out)
        made.append(args[0].problem.id)
        return real_make_row(*args, **kwargs)

    real_make_row, out = running.make_row, tmp_path / "run"
    monkeypatch.setattr(running, "make_row", make_row)
    config = lp.EvalConfig(max_new_tokens=3, batch_size=1)
    with pytest.raises(lp.LensprobeError, match=FOLDER_GONE.format(re.escape(str(out)))):
        lp.evaluate(tiny, PROBLEMS, "w/o", out=out, config=config, model_name="tiny", progress=False)
    assert len(made) == 2  # noticed at the next row, not after every generation


def write_folder(out, model: str, verdicts: dict[str, list[bool]], settings: dict | None = None):
    """A result folder written by hand: per condition, one math-verify verdict per problem."""
    config_hash = prepare_folder(out, {"model": model, **(settings or {})}, {c: {"hash": c} for c in verdicts})["hash"]
    with RowWriter(results_file(out, 0)) as writer:
        for cond, marks in verdicts.items():
            for i, ok in enumerate(marks):
                writer.write({"condition": cond, "problem_id": f"q{i}", "sample": 0, "model": model, "level": 1,
                              "subject": "S", "answer": "1", "prediction": "1" if ok else "2", "math-verify": ok,
                              "paper": ok, "paper-lenient": ok, "paper-exact": ok, "finish": "eos",
                              "config_hash": config_hash, "condition_hash": cond})
    return out


VERDICTS = {"w/o": [True, False, False], "w/ Mless": [True, True, False]}


def mcnemar_n(rows) -> int:
    cmp = summary_tables(rows)["comparisons"]
    return int(cmp[cmp["grader"] == "math-verify"]["n"].iloc[0])


def test_one_folder_given_twice_is_refused(tmp_path, capsys):
    a = write_folder(tmp_path / "a", "m", VERDICTS)
    assert len(load_many_results([a])) == 6 and mcnemar_n(load_many_results([a])) == 3
    (tmp_path / "link").symlink_to(a)
    with pytest.raises(lp.LensprobeError, match=r"result folder .*link is given twice \(also as .*a\): name each"):
        load_many_results([a, tmp_path / "link"])
    assert main(["eval-report", str(a), str(a)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is given twice" in err


def test_rows_in_two_folders_of_one_run_are_counted_once(tmp_path):
    a = write_folder(tmp_path / "a", "m", VERDICTS)
    copy = write_folder(tmp_path / "copy", "m", VERDICTS)  # same settings: a part of the same run
    with pytest.warns(DuplicateRowsWarning, match=r"6 row\(s\) of copy are also in a folder given before it"):
        rows = load_many_results([a, copy])
    assert len(rows) == 6 and mcnemar_n(rows) == 3 and set(rows["model"]) == {"m"}
    other = write_folder(tmp_path / "b", "m", {"w/o": [False] * 3, "w/ Mless": [True] * 3}, settings={"other": 2})
    both = load_many_results([a, other])  # other settings: told apart, each counted once
    assert len(both) == 12 and set(both["model"]) == {"m (a)", "m (b)"}
    cmp = summary_tables(both)["comparisons"]
    assert cmp[cmp["grader"] == "math-verify"]["n"].tolist() == [3, 3]


FAR = lp.Condition("far", interventions=(lp.ablate_heads("L0H1", positions=[10_000]),))  # refused after preparing


@pytest.mark.parametrize("existed", [False, True])
def test_a_run_refused_after_preparing_its_folder_leaves_nothing_behind(tiny, tmp_path, existed):
    out = tmp_path / "run"
    if existed:
        out.mkdir()  # a folder the user made stays, empty
    with pytest.raises(lp.LensprobeError, match="condition 'far': ablation positions 10000 lie outside"):
        lp.evaluate(tiny, PROBLEMS, [FAR], out=out, config=CONFIG, model_name="tiny", progress=False)
    assert out.exists() == existed
    assert not existed or list(out.iterdir()) == []


def test_a_refused_resume_keeps_the_folder_and_its_rows(tiny, tmp_path):
    out = tmp_path / "run"
    run(tiny, out)
    rows = read_rows(out)
    with pytest.raises(lp.LensprobeError, match="condition 'far'"):
        lp.evaluate(tiny, PROBLEMS, ["w/o", FAR], out=out, config=CONFIG, model_name="tiny", progress=False)
    assert (out / "config.json").is_file() and read_rows(out) == rows
