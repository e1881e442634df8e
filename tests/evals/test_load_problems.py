"""load_problems: any JSONL or Parquet problem set (AIME, custom field names), and MATH-500 unchanged."""

import dataclasses
import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lensprobe as lp
from lensprobe.evals.problems.load import PACKAGED_MATH500, Problem, load_problems

AIME = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "aime"


@pytest.fixture(scope="session")
def aime_dir() -> Path:
    assert (AIME / "README.md").is_file(), f"the AIME sets were not found at {AIME}; the repo expects ../shared beside it"
    return AIME


def _raw(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- AIME, as shipped beside the repo
def test_aime2025_reads_the_question_field(aime_dir, caplog):
    path = aime_dir / "aime2025.jsonl"
    with caplog.at_level(logging.INFO, logger="lensprobe.evals.problems.load"):
        probs = load_problems(path)
    assert "no 'problem' field; reading 'question'" in caplog.text
    raw = _raw(path)
    assert len(probs) == 30 == len(raw)  # the README's count
    assert [p.problem for p in probs] == [r["question"] for r in raw]
    assert [p.answer for p in probs] == [r["answer"] for r in raw]
    assert all(isinstance(p.answer, str) for p in probs)
    assert [p.id for p in probs] == [f"aime2025-{i}" for i in range(30)]
    assert all(p.subject is None and p.level is None for p in probs)


def test_aime_2022_2024(aime_dir):
    path = aime_dir / "aime_2022_2024.jsonl"
    probs = load_problems(path)
    raw = _raw(path)
    assert len(probs) == 90 == len(raw)
    assert [p.id for p in probs] == [str(r["id"]) for r in raw]
    assert len({p.id for p in probs}) == 90
    assert [p.answer for p in probs] == [r["answer"] for r in raw]  # leading zeros kept ("033")
    assert all(isinstance(p.answer, str) and p.answer.isdigit() for p in probs)
    only_2024 = load_problems(path, keep=lambda row: "2024_AIME" in row["url"], id_field="url")
    assert len(only_2024) == 30 and len({p.id for p in only_2024}) == 30
    assert all("2024_AIME" in p.id for p in only_2024)


def test_both_aime_sets_together_have_unique_ids(aime_dir):
    both = load_problems(aime_dir / "aime2025.jsonl") + load_problems(aime_dir / "aime_2022_2024.jsonl")
    assert len({p.id for p in both}) == 120


# ----------------------------------------------------------------------------- custom files
ROWS = [
    {"Q": "What is 2 + 3?", "A": 5, "key": "p-a", "topic": "Arithmetic", "difficulty": 1},
    {"Q": "What is 10 / 4?", "A": "2.5", "key": "p-b", "topic": "Arithmetic", "difficulty": 2},
    {"Q": "Solve x + 1 = 3.", "A": " 2 ", "key": "p-c", "topic": "Algebra", "difficulty": 2},
]
CUSTOM = dict(problem_field="Q", answer_field="A", id_field="key", subject_field="topic", level_field="difficulty")


def _check_custom(probs):
    assert [p.id for p in probs] == ["p-a", "p-b", "p-c"]
    assert [p.answer for p in probs] == ["5", "2.5", "2"]
    assert [p.problem for p in probs] == [r["Q"] for r in ROWS]
    assert [p.subject for p in probs] == ["Arithmetic", "Arithmetic", "Algebra"]
    assert [p.level for p in probs] == [1, 2, 2]
    assert all(type(p) is Problem for p in probs)


def test_jsonl_with_custom_fields(tmp_path):
    path = _write_jsonl(tmp_path / "mine.jsonl", ROWS)
    _check_custom(load_problems(path, **CUSTOM))
    assert [p.id for p in load_problems(path, **CUSTOM, levels=2, subjects="Algebra")] == ["p-c"]


def test_parquet_with_custom_fields(tmp_path):
    path = tmp_path / "mine.parquet"
    # the answers as one string column, as Parquet needs one type per column
    pq.write_table(pa.Table.from_pylist([{**r, "A": str(r["A"])} for r in ROWS]), path)
    _check_custom(load_problems(path, **CUSTOM))


def test_parquet_integer_answers_and_default_ids(tmp_path):
    path = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"question": ["1+1?", "2+2?", "3+3?"], "Answer": [2, 4, 6]}), path)
    probs = load_problems(path)
    assert [p.answer for p in probs] == ["2", "4", "6"]
    assert [p.id for p in probs] == ["ints-0", "ints-1", "ints-2"]
    assert [p.problem for p in probs] == ["1+1?", "2+2?", "3+3?"]


def test_jsonl_blank_lines_keep_default_ids_stable(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_text('{"problem": "a?", "answer": "1"}\n\n{"problem": "b?", "answer": "2"}\n', encoding="utf-8")
    assert [p.id for p in load_problems(path)] == ["set-0", "set-1"]
    assert [p.id for p in load_problems(path, keep=lambda r: r["answer"] == "2")] == ["set-1"]
    assert [p.id for p in load_problems(path, seed=1)] in (["set-0", "set-1"], ["set-1", "set-0"])


@pytest.mark.unchecked
def test_json_list_and_explicit_format(tmp_path):
    rows = [{"problem": "a?", "answer": "1"}, {"problem": "b?", "answer": "2"}]
    listed = tmp_path / "listed.json"
    listed.write_text(json.dumps(rows), encoding="utf-8")
    assert [p.answer for p in load_problems(listed)] == ["1", "2"]
    odd = _write_jsonl(tmp_path / "set.txt", rows)
    with pytest.raises(lp.LensprobeError, match=r"cannot tell the format .*file_format='jsonl'"):
        load_problems(odd)
    assert [p.answer for p in load_problems(odd, file_format="jsonl")] == ["1", "2"]
    with pytest.raises(lp.LensprobeError, match=r"file_format must be one of"):
        load_problems(odd, file_format="csv")


# ----------------------------------------------------------------------------- errors
def test_missing_field_lists_the_columns(tmp_path):
    path = _write_jsonl(tmp_path / "x.jsonl", [{"prompt": "a?", "target": "1"}])
    with pytest.raises(lp.LensprobeError,
                       match=r"no field 'problem' \(or 'question', 'Problem', 'Question'\).*"
                             r"columns are \['prompt', 'target'\].*problem_field="):
        load_problems(path)
    with pytest.raises(lp.LensprobeError, match=r"no field 'answer' \(or 'Answer'.*columns are .*answer_field="):
        load_problems(path, problem_field="prompt")
    with pytest.raises(lp.LensprobeError, match=r"no field 'solution' in the rows; .*\['prompt', 'target'\]"):
        load_problems(path, problem_field="prompt", answer_field="solution")
    assert load_problems(path, problem_field="prompt", answer_field="target")[0].answer == "1"
    with pytest.raises(lp.LensprobeError, match=r"no field 'uid'.*id_field="):
        load_problems(path, problem_field="prompt", answer_field="target", id_field="uid")


def test_explicit_field_is_not_replaced_by_an_alternative(tmp_path):
    path = _write_jsonl(tmp_path / "x.jsonl", [{"question": "a?", "answer": "1"}])
    with pytest.raises(lp.LensprobeError, match=r"no field 'text' in the rows"):
        load_problems(path, problem_field="text")


def test_row_errors_name_the_row(tmp_path):
    path = _write_jsonl(tmp_path / "x.jsonl", [{"question": "a?", "answer": "1"}, {"question": "b?"}])
    with pytest.raises(lp.LensprobeError, match=r"line 2: the row has no 'answer' field"):
        load_problems(path)
    pq_path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"problem": ["a?", "b?"], "answer": ["1", None]}), pq_path)
    with pytest.raises(lp.LensprobeError, match=r"row 1: its 'answer' is None"):
        load_problems(pq_path)
    ids = _write_jsonl(tmp_path / "ids.jsonl", [{"problem": "a?", "answer": "1", "k": "same"},
                                                {"problem": "b?", "answer": "2", "k": "same"}])
    with pytest.raises(lp.LensprobeError, match=r"two rows share the id 'same'"):
        load_problems(ids, id_field="k")
    with pytest.raises(lp.LensprobeError, match=r"problem file not found"):
        load_problems(tmp_path / "missing.jsonl")
    with pytest.raises(lp.LensprobeError, match=r"keep dropped every row"):
        load_problems(ids, keep=lambda row: False)
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"problem": "a", "answer": "1"}\n{"problem": \n', encoding="utf-8")
    with pytest.raises(lp.LensprobeError, match=r"line 2 is not valid JSON"):
        load_problems(bad_json)
    not_parquet = tmp_path / "fake.parquet"
    not_parquet.write_text("not parquet", encoding="utf-8")
    with pytest.raises(lp.LensprobeError, match=r"could not be read as Parquet"):
        load_problems(not_parquet)


# ----------------------------------------------------------------------------- MATH-500 unchanged
def test_math500_is_load_problems_on_the_shipped_file(math500_path, monkeypatch):
    monkeypatch.delenv("LENSPROBE_MATH500", raising=False)
    shipped = lp.load_math500()
    generic = load_problems(PACKAGED_MATH500)
    assert len(shipped) == len(generic) == 500
    for a, b in zip(shipped, generic, strict=True):
        assert dataclasses.asdict(a) == dataclasses.asdict(b)
    raw = _raw(math500_path)
    assert [p.id for p in shipped] == [r["unique_id"] for r in raw]
    assert [(p.answer, p.subject, p.level) for p in shipped] == [(r["answer"], r["subject"], r["level"]) for r in raw]
    a = lp.load_math500(levels=[1, 2], subjects="Algebra", limit=9, seed=4)
    b = load_problems(PACKAGED_MATH500, levels=[1, 2], subjects="Algebra", limit=9, seed=4)
    assert a == b and len(a) == 9


def test_math500_default_ids_are_unchanged(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps({"problem": "1+1?", "answer": "x\n#### 2"}) + "\n\n"
                    + json.dumps({"problem": "2+2?", "answer": 4}) + "\n", encoding="utf-8")
    assert [(p.id, p.answer) for p in lp.load_math500(path)] == [("line-1", "2"), ("line-3", "4")]
    assert [(p.id, p.answer) for p in load_problems(path)] == [("gsm-0", "2"), ("gsm-1", "4")]


@pytest.mark.parametrize(("row", "message"), [
    ('{"problem": "What is 1+1?", "answer": "2\\udcff"}', r"line 1: 'answer' holds a lone surrogate \(U\+DCFF"),
    ('{"problem": "\\u200b\\ufeff", "answer": "2"}', r"line 1: 'problem' must be a non-empty string \(not only"),
])
def test_a_problem_file_row_that_is_not_text_is_refused_when_read(tmp_path, row, message):
    path = tmp_path / "p.jsonl"
    path.write_text(row + "\n", encoding="utf-8")
    with pytest.raises(lp.LensprobeError, match=message):
        load_problems(path)
