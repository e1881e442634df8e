"""Files that are not files: every file lensprobe reads is checked to be a regular file of bounded size
before a byte is read (a link to /dev/zero or /dev/full would be read without end, a FIFO would wait for
a writer forever)."""

import contextlib
import json
import os
import signal

import pytest

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.core.storage.files import check_file, read_bytes, read_text
from lensprobe.core.storage.store import read_json
from lensprobe.evals import Problem
from lensprobe.evals.results.folder import load_results, results_file


@contextlib.contextmanager
def at_most(seconds: int):
    """Fail (rather than hang the suite) when the block waits on a FIFO."""

    def stop(signum, frame):
        raise AssertionError(f"still reading after {seconds} s: the read waits for a writer")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def not_a_file(path, kind: str) -> None:
    """Put something that is not a regular file at ``path``."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to(kind)


KINDS = [("fifo", "is a FIFO"), ("/dev/zero", r"\(a link to /dev/zero\) is a character device"),
         ("/dev/full", r"\(a link to /dev/full\) is a character device"), ("folder", "is a folder")]


@pytest.mark.parametrize(("kind", "said"), KINDS)
def test_what_is_not_a_regular_file_is_refused_before_a_read(tmp_path, kind, said):
    path = tmp_path / "x.jsonl"
    not_a_file(path, kind)
    with at_most(10):
        for read in (check_file, read_bytes, read_text):
            with pytest.raises(lp.LensprobeError, match=rf"row file .*x.jsonl {said}.*, not a regular file: .*give "
                                                        "the path of a file"):
                read(path, "row file")


def test_a_file_over_the_limit_a_missing_file_and_bytes_that_are_not_utf8_are_named(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b"x" * 2000)
    assert check_file(path, "settings file", 2000) == 2000 and read_bytes(path, "settings file", 2000) == b"x" * 2000
    with pytest.raises(lp.LensprobeError, match=r"settings file .*big.json is 2000 bytes, more than the 1999 bytes "):
        read_bytes(path, "settings file", 1999)
    with pytest.raises(lp.LensprobeError, match=r"recipe file .*gone.toml does not exist: check the path"):
        read_text(tmp_path / "gone.toml", "recipe file")
    path.write_bytes("café".encode("latin-1"))
    with pytest.raises(lp.LensprobeError, match=r"big.json is not UTF-8 text \(byte 3 is 0xe9\): save it as UTF-8"):
        read_text(path, "settings file")


@pytest.fixture
def run(tiny, tmp_path):
    """A finished evaluation folder (config.json and one results file)."""
    probs = [Problem(id=f"q{i}", problem=f"What is {i}+{i}?", answer=str(2 * i)) for i in range(2)]
    out = tmp_path / "run"
    lp.evaluate(tiny, probs, "w/o", out=out, max_new_tokens=2, model_name="tiny", progress=False)
    return out, probs


@pytest.mark.parametrize(("kind", "said"), KINDS[:2])
def test_result_rows_that_are_not_a_file_are_refused_by_eval_report_and_a_resumed_run(tiny, run, capsys, kind,
                                                                                      said):
    out, probs = run
    not_a_file(results_file(out, 0), kind)
    with at_most(30):
        with pytest.raises(lp.LensprobeError, match=rf"results-rank0.jsonl {said}"):
            load_results(out)
        assert main(["eval-report", str(out), "--out", str(out.parent / "report")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "results-rank0.jsonl" in err and "not a regular file" in err
        with pytest.raises(lp.LensprobeError, match=rf"results-rank0.jsonl {said}"):
            lp.evaluate(tiny, probs, "w/o", out=out, max_new_tokens=2, model_name="tiny", progress=False)


@pytest.mark.parametrize(("kind", "said"), KINDS[:2])
def test_a_config_json_that_is_not_a_file_is_refused_not_taken_for_a_new_folder(tiny, run, kind, said):
    out, probs = run
    not_a_file(out / "config.json", kind)
    with at_most(30), pytest.raises(lp.LensprobeError, match=rf"config.json {said}"):
        lp.evaluate(tiny, probs, "w/o", out=out, max_new_tokens=2, model_name="tiny", progress=False)
    assert main(["eval-report", str(out), "--out", str(out.parent / "report")]) == 2


def test_a_settings_file_a_recipe_a_problem_file_and_a_trace_that_are_not_files_are_refused(tmp_path):
    path = tmp_path / "config.json"
    not_a_file(path, "fifo")
    with at_most(10):
        with pytest.raises(lp.LensprobeError, match="config.json is a FIFO"):
            read_json(path)
        recipe = tmp_path / "mine.toml"
        not_a_file(recipe, "/dev/zero")
        with pytest.raises(lp.LensprobeError, match=r"recipe file .*mine.toml \(a link to /dev/zero\)"):
            lp.app.recipe.load_recipe(str(recipe))
        trace = tmp_path / "trace.json"
        not_a_file(trace, "fifo")
        with pytest.raises(lp.LensprobeError, match="trace file .*trace.json is a FIFO"):
            lp.generation.load_trace(trace)


def test_problem_files_are_read_once_through_the_check(tmp_path, monkeypatch):
    """JSONL and JSON-list problem files still read as before (lines counted as a file counts them)."""
    rows = [{"problem": "What is 1+1?", "answer": "2"}, {"problem": "Line\u2028sep?", "answer": "3"}]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_bytes(("\r\n".join(json.dumps(r) for r in rows) + "\r\n\r\n").encode())
    assert [p.answer for p in lp.evals.load_problems(jsonl)] == ["2", "3"]
    listed = tmp_path / "p.json"
    listed.write_text(json.dumps(rows), encoding="utf-8")
    assert [p.problem for p in lp.evals.load_problems(listed)] == ["What is 1+1?", "Line\u2028sep?"]
    import lensprobe.evals.problems.files as problem_files

    monkeypatch.setattr(problem_files, "DATA_LIMIT", 10)
    with pytest.raises(lp.LensprobeError, match=r"problem file .*p.json is \d+ bytes, more than the 10 bytes"):
        lp.evals.load_problems(listed)
