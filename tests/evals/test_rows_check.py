"""Result rows read back are checked: wrong types are refused with file, line and fix (never counted),
a NaN verdict is a missing verdict everywhere, rows written twice with different verdicts are refused naming
both, and rows of another run (or without the folder's config.json) are refused."""

import json
import math
import re
import shutil

import pandas as pd
import pytest

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.core.storage.rowfiles import ROW_DIGEST, row_line
from lensprobe.evals import Problem
from lensprobe.evals.results.folder import load_results, read_rows, results_file
from lensprobe.evals.results.rows_check import check_row, check_verdict_column, is_verdict

PROBLEMS = [Problem(id=f"q{i}", problem=f"What is {i}+{i}?", answer=str(2 * i), level=1, subject="S")
            for i in range(3)]
CONFIG = lp.EvalConfig(max_new_tokens=2, batch_size=3)


def run(tiny, out):
    return lp.evaluate(tiny, PROBLEMS, "w/o", out=out, config=CONFIG, model_name="tiny", progress=False)


@pytest.fixture(scope="module")
def folder(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("rows") / "run"
    run(tiny, out)
    return out


@pytest.fixture
def copy(folder, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(folder, out)
    return out


def lines(out) -> list[str]:
    return results_file(out, 0).read_text(encoding="utf-8").splitlines()


def seal(text: str) -> str:
    """A row's JSON text as lensprobe writes it (with its digest, so the row's own checks are reached); a value
    that is not an object stays as it is."""
    value = json.loads(text)
    if not isinstance(value, dict):
        return text
    return row_line({k: v for k, v in value.items() if k != ROW_DIGEST}).rstrip("\n")


def edit(out, line_no: int, change) -> None:
    """Replace row ``line_no`` (1-based) of the results file by ``change(row)`` (a JSON text), sealed."""
    rows = lines(out)
    rows[line_no - 1] = seal(change(json.loads(rows[line_no - 1])))
    results_file(out, 0).write_text("\n".join(rows) + "\n", encoding="utf-8")


def with_field(key, value):
    return lambda row: json.dumps({**row, key: value}, allow_nan=True)


@pytest.mark.parametrize("key,value", [("math-verify", "false"), ("math-verify", "False"), ("paper", 0),
                                       ("paper", -1), ("paper-lenient", 0.5), ("sample", "0"), ("sample", -1),
                                       ("sample", True), ("problem_id", 7), ("condition", None)])
def test_a_field_of_the_wrong_type_is_refused_with_file_line_and_fix(copy, key, value):
    edit(copy, 2, with_field(key, value))
    with pytest.raises(lp.LensprobeError, match=rf"results-rank0\.jsonl line 2: '{key}' is .* which is not .*: fix "
                                                r"it \(verdicts are true, false or null"):
        load_results(copy)


@pytest.mark.parametrize("text,what", [
    ("null", "has no row_digest"), ("[1, 2, 3]", "has no row_digest"), ('"row"', "has no row_digest"),
    ("{}", "is not a result row: it has no 'condition', 'problem_id', 'sample' field")])
def test_a_line_that_is_not_a_row_is_refused_by_eval_report_in_one_line(copy, text, what, capsys):
    edit(copy, 3, lambda row: text)
    assert main(["eval-report", str(copy)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "results-rank0.jsonl line 3 " + what in err, err
    assert ("delete that line to run the row again" in err) == (text == "{}")


def test_a_row_edited_by_hand_is_refused_naming_its_line(copy, capsys):
    """An edit that keeps the row well-formed (a number changed) is caught by the line's digest."""
    rows = lines(copy)
    edited = re.sub(r'"seconds": [0-9.e-]+', '"seconds": 123.5', rows[1])
    assert edited != rows[1]
    rows[1] = edited
    results_file(copy, 0).write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert main(["eval-report", str(copy)]) == 2
    assert "results-rank0.jsonl line 2 does not match its row_digest" in capsys.readouterr().err


def test_a_row_without_problem_id_stops_a_resume_before_generating(copy, tiny):
    edit(copy, 1, lambda row: json.dumps({k: v for k, v in row.items() if k != "problem_id"}))
    with pytest.raises(lp.LensprobeError, match=r"line 1 is not a result row: it has no 'problem_id' field"):
        run(tiny, copy)


def test_a_string_sample_is_refused_on_resume_instead_of_running_the_row_again(copy, tiny):
    edit(copy, 1, with_field("sample", "0"))
    with pytest.raises(lp.LensprobeError, match=r"line 1: 'sample' is '0' \(str\), which is not a whole number"):
        run(tiny, copy)
    assert len(lines(copy)) == 3  # nothing was generated


def test_eval_report_refuses_a_string_verdict_instead_of_counting_it(copy, capsys):
    edit(copy, 2, with_field("math-verify", "false"))
    assert main(["eval-report", str(copy)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 2: 'math-verify' is 'false' (str), which is not true, false or null" in err


def test_a_nan_verdict_is_a_missing_verdict_left_out_named_and_retried(copy, tiny, capsys):
    edit(copy, 2, with_field("math-verify", math.nan))
    rows = load_results(copy)
    bad = rows[rows["problem_id"] == "q1"].iloc[0]
    assert bad["finish"] == "error" and all(bad[g] is None for g in lp.evals.GRADERS)
    assert "'math-verify' verdict was NaN" in bad["error"] and "line 2" in bad["error"]
    assert lp.evals.accuracy(rows)["n"].tolist() == [2]  # left out of n
    assert main(["eval-report", str(copy)]) == 0
    out = capsys.readouterr().out
    assert "1 row(s)" in out and "verdict was NaN" in out  # named in the summary
    again = run(tiny, copy)  # and generated again on resume
    assert len(lines(copy)) == 4 and again.set_index("problem_id").loc["q1", "finish"] != "error"
    assert again.set_index("problem_id").loc["q1", "math-verify"] in (True, False)


def test_rows_written_twice_with_different_verdicts_are_refused_naming_both_lines(copy, capsys):
    first = json.loads(lines(copy)[0])
    with results_file(copy, 0).open("a", encoding="utf-8") as f:
        f.write(seal(json.dumps({**first, "seconds": 9.0})) + "\n")  # a copy with the same verdicts: the first counts
    assert len(read_rows(copy)) == 4 and len(load_results(copy)) == 3
    with results_file(copy, 1).open("a", encoding="utf-8") as f:  # another rank's file disagrees
        f.write(seal(json.dumps({**first, "math-verify": not first["math-verify"]})) + "\n")
    with pytest.raises(lp.LensprobeError, match=r"two results for \('w/o', 'q0', 0\) disagree: .*results-rank0\.jsonl "
                                                r"line 1 and .*results-rank1\.jsonl line 1\. Which one is right cannot "
                                                r"be told from the files: delete the wrong line"):
        read_rows(copy)
    assert main(["eval-report", str(copy)]) == 2  # never counted, whichever rank wrote it later
    assert "results-rank1.jsonl line 1" in capsys.readouterr().err


@pytest.fixture(scope="module")
def other_run_rows(tiny, tmp_path_factory):
    """The rows file of a run with other generation settings."""
    out = tmp_path_factory.mktemp("other") / "run"
    lp.evaluate(tiny, PROBLEMS, "w/o", out=out, config=lp.EvalConfig(max_new_tokens=3, batch_size=3),
                model_name="tiny", progress=False)
    return results_file(out, 0)


def test_rows_of_another_run_are_refused_by_eval_report_and_by_a_resume(copy, tiny, other_run_rows, capsys):
    """Rows recording another config_hash used to be counted by eval-report and taken as finished on resume."""
    shutil.copy(other_run_rows, results_file(copy, 1))
    theirs = json.loads(other_run_rows.read_text().splitlines()[0])["config_hash"]
    ours = json.loads((copy / "config.json").read_text())["hash"]
    assert theirs != ours
    refused = (rf"results-rank1\.jsonl line 1 records config_hash '{theirs}', but the folder's config\.json has "
               rf"'{ours}': rows of another run are neither counted nor resumed: move results-rank1\.jsonl to the "
               "folder of the run that wrote it")
    with pytest.raises(lp.LensprobeError, match=refused):
        read_rows(copy)
    with pytest.raises(lp.LensprobeError, match=refused):
        run(tiny, copy)
    assert main(["eval-report", str(copy)]) == 2
    assert f"records config_hash '{theirs}'" in capsys.readouterr().err
    results_file(copy, 1).unlink()
    edit(copy, 3, with_field("condition_hash", "c0ffee"))  # one condition's row of another definition
    with pytest.raises(lp.LensprobeError, match=r"line 3 records condition 'w/o' with condition_hash 'c0ffee', but "
                                                r"the folder's config\.json records '.*' for it"):
        load_results(copy)


def test_a_folder_with_rows_but_no_config_is_refused_not_given_a_new_identity(copy, tiny, capsys):
    (copy / "config.json").unlink()
    before = results_file(copy, 0).read_bytes()
    refused = (r"holds result rows \(results-rank0\.jsonl line 1, \.\.\.\) but no config\.json: the run they belong "
               r"to cannot be checked, so they are neither counted nor resumed\. Use a new output folder, or delete this one")
    with pytest.raises(lp.LensprobeError, match=refused):
        read_rows(copy)
    with pytest.raises(lp.LensprobeError, match=refused):
        run(tiny, copy)  # a resume does not write a new config.json that adopts the rows
    assert not (copy / "config.json").exists() and results_file(copy, 0).read_bytes() == before
    assert main(["eval-report", str(copy)]) == 2 and "but no config.json" in capsys.readouterr().err


def test_a_line_of_bytes_that_are_not_utf8_is_refused_with_its_line(copy):
    data = results_file(copy, 0).read_bytes()
    results_file(copy, 0).write_bytes(data + b'{"condition": "w/o \xff"}\n')
    with pytest.raises(lp.LensprobeError, match=r"line 4 is not valid JSON \(bytes that are not UTF-8\)"):
        read_rows(copy)


def test_an_error_row_with_a_verdict_is_refused():
    row = {"condition": "w/o", "problem_id": "q", "sample": 0, "finish": "error", "math-verify": True}
    with pytest.raises(lp.LensprobeError, match=r"r\.jsonl line 5 has finish 'error' \(no answer\) but a "
                                                r"'math-verify' verdict True"):
        check_row(row, "r.jsonl", 5)


@pytest.mark.parametrize("value", ["False", "0", 0, -1, 0.5, 1.0])
def test_a_table_column_of_non_verdicts_is_refused(value):
    df = pd.DataFrame({"math-verify": [True, value, None]})
    with pytest.raises(lp.LensprobeError, match=r"the 'math-verify' column holds .* at row 1: verdicts must be True, "
                                                "False or None"):
        check_verdict_column(df, "math-verify")
    check_verdict_column(pd.DataFrame({"math-verify": [True, False, None, math.nan]}), "math-verify")
    assert is_verdict(pd.Series([True]).iloc[0]) and not is_verdict("true")


def test_rows_math_verify_timed_out_on_are_left_out_and_counted_in_the_summary(copy, capsys):
    edit(copy, 1, with_field("math-verify", None))  # what a row math-verify timed out on holds
    assert lp.evals.accuracy(load_results(copy))["n"].tolist() == [2]
    assert main(["eval-report", str(copy)]) == 0
    assert "1 row(s) have no math-verify verdict: it timed out grading them" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["False", "0", -1, 0.5])
def test_accuracy_and_compare_refuse_verdicts_of_the_wrong_type(value):
    rows = pd.DataFrame({"condition": ["a", "a", "b", "b"], "problem_id": ["p", "q", "p", "q"], "sample": 0,
                         "math-verify": [False, value, False, False]})
    with pytest.raises(lp.LensprobeError, match="verdicts must be True, False or None"):
        lp.evals.accuracy(rows, grader="math-verify")
    with pytest.raises(lp.LensprobeError, match="verdicts must be True, False or None"):
        lp.evals.compare(rows, "a", "b", grader="math-verify")


@pytest.mark.unchecked
@pytest.mark.parametrize("counts", [(math.nan, 4), (1, 4.0), (True, 4)])
def test_wilson_interval_refuses_counts_that_are_not_whole_numbers(counts):
    with pytest.raises(lp.LensprobeError, match="wilson_interval needs whole-number counts"):
        lp.evals.wilson_interval(*counts)


@pytest.mark.unchecked
@pytest.mark.parametrize("answer", [None, 7, "  ", "\u200b"])
def test_evaluate_refuses_an_answer_that_is_not_text_before_generating(tiny, answer, monkeypatch):
    monkeypatch.setattr(lp.evals.running.harness, "run_plan", lambda *a, **k: pytest.fail("generation started"))
    bad = [*PROBLEMS[:1], Problem(id="q9", problem="What is 1+1?", answer=answer)]
    with pytest.raises(lp.LensprobeError, match=r"problem 'q9': its answer must be non-empty text"):
        lp.evaluate(tiny, bad, "w/o", config=CONFIG, progress=False)


@pytest.mark.parametrize(("field", "value"), [("problem", "What is \udcff?"), ("answer", "2\udcff"),
                                              ("problem", "\ufeff")])
def test_evaluate_refuses_a_problem_that_would_fail_when_its_row_is_written(tiny, field, value, monkeypatch):
    monkeypatch.setattr(lp.evals.running.harness, "run_plan", lambda *a, **k: pytest.fail("generation started"))
    bad = Problem(**{"id": "q9", "problem": "What is 1+1?", "answer": "2", field: value})
    with pytest.raises(lp.LensprobeError, match=rf"problem 'q9': its (id must be a string and its )?{field} (holds a lone|non-empty text \(not only)"):
        lp.evaluate(tiny, [bad], "w/o", config=CONFIG, progress=False)
