"""MATH-500 loading, conditions, statistics and result folders (no generation)."""

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest

import lensprobe as lp
from lensprobe.core.storage.identity import IDENTITY_VERSION
from lensprobe.core.storage.rowfiles import row_line
from lensprobe.evals import (
    BUILTIN_CONDITIONS,
    accuracy,
    builtin_condition,
    compare,
    mcnemar_exact,
    pass_at_k,
    resolve_conditions,
    wilson_interval,
)
from lensprobe.evals.results.folder import RowWriter, load_results, prepare_folder, read_rows
from lensprobe.prompts import Condition


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- data
def test_load_math500_local_file(math500_path):
    probs = lp.load_math500(math500_path)
    assert len(probs) == 500
    raw = [json.loads(line) for line in math500_path.read_text(encoding="utf-8").splitlines()]
    assert [p.id for p in probs] == [r["unique_id"] for r in raw]
    assert [p.answer for p in probs] == [r["answer"] for r in raw]
    assert probs[0].problem == raw[0]["problem"] and probs[0].level == raw[0]["level"]
    level1 = lp.load_math500(math500_path, levels=1)
    assert len(level1) == sum(r["level"] == 1 for r in raw) and all(p.level == 1 for p in level1)
    alg = lp.load_math500(math500_path, subjects=["Algebra", "Geometry"], levels=[1, 2])
    assert len(alg) == sum(r["subject"] in ("Algebra", "Geometry") and r["level"] in (1, 2) for r in raw)
    assert [p.id for p in lp.load_math500(math500_path, limit=5)] == [r["unique_id"] for r in raw[:5]]
    a = lp.load_math500(math500_path, limit=7, seed=3)
    b = lp.load_math500(math500_path, limit=7, seed=3)
    assert [p.id for p in a] == [p.id for p in b] != [r["unique_id"] for r in raw[:7]]


def test_load_any_problem_answer_jsonl(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text(
        json.dumps({"problem": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"}) + "\n\n"
        + json.dumps({"problem": "What is 1000 + 234?", "answer": "#### 1,234", "id": "q2"}) + "\n"
        + json.dumps({"problem": "What is 2*21?", "answer": 42}) + "\n", encoding="utf-8")
    probs = lp.load_math500(path)
    assert [p.answer for p in probs] == ["7", "1234", "42"]
    assert [p.id for p in probs] == ["line-1", "q2", "line-4"]
    assert probs[0].level is None and probs[0].subject is None


def test_malformed_line_names_its_number(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{"problem": "b", "answer": \n', encoding="utf-8")
    with pytest.raises(lp.LensprobeError, match=r"line 2 is not valid JSON"):
        lp.load_math500(path)


def test_row_without_answer(tmp_path):
    path = _write_jsonl(tmp_path / "x.jsonl", [{"problem": "a", "answer": "1"}, {"problem": "b"}])
    with pytest.raises(lp.LensprobeError, match=r"line 2: the row has no 'answer' field"):
        lp.load_math500(path)


def test_other_bad_data(tmp_path, math500_path):
    with pytest.raises(lp.LensprobeError, match="not found"):
        lp.load_math500(tmp_path / "missing.jsonl")
    with pytest.raises(lp.LensprobeError, match="unknown subject"):
        lp.load_math500(math500_path, subjects="Astrology")
    with pytest.raises(lp.LensprobeError, match="unknown level"):
        lp.load_math500(math500_path, levels=9)
    with pytest.raises(lp.LensprobeError, match="limit"):
        lp.load_math500(math500_path, limit=0)
    dup = _write_jsonl(tmp_path / "dup.jsonl", [{"problem": "a", "answer": "1", "id": 1},
                                                {"problem": "b", "answer": "2", "id": 1}])
    with pytest.raises(lp.LensprobeError, match="share the id"):
        lp.load_math500(dup)


@pytest.mark.slow  # importing datasets and failing to reach the hub takes ~20 s
def test_hub_offline_says_pass_a_path(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # The test suite runs with HF_HUB_OFFLINE=1 (the hub is unreachable here).
    with pytest.raises(lp.LensprobeError, match=r"(?s)HuggingFaceH4/MATH-500.*pass the local file: --data math500.jsonl"):
        lp.load_math500("hub")


def test_shipped_math500_is_the_shared_file_byte_for_byte(math500_path, monkeypatch):
    monkeypatch.delenv("LENSPROBE_MATH500", raising=False)
    shipped = lp.evals.math500_path()
    assert shipped != math500_path and shipped.read_bytes() == math500_path.read_bytes()
    assert [p.id for p in lp.load_math500()] == [p.id for p in lp.load_math500(math500_path)]
    assert len(lp.load_math500()) == 500


def test_math500_path_follows_the_environment(tmp_path, monkeypatch):
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"problem": "1+1?", "answer": "2"}\n', encoding="utf-8")
    monkeypatch.setenv("LENSPROBE_MATH500", str(mine))
    assert lp.evals.math500_path() == mine and [p.answer for p in lp.load_math500()] == ["2"]
    monkeypatch.setenv("LENSPROBE_MATH500", str(tmp_path / "missing.jsonl"))
    with pytest.raises(lp.LensprobeError, match="LENSPROBE_MATH500=.*is not a file"):
        lp.evals.math500_path()


# ----------------------------------------------------------------------------- conditions
def test_builtin_conditions_follow_the_paper(tiny):
    conds = resolve_conditions("w/o, w/ Mless,w/ Mful,random sentence")
    assert [c.name for c in conds] == list(BUILTIN_CONDITIONS)
    q = "What is 12+7?"
    prompts = {c.name: c.prompt_builder(tiny)(q) for c in conds}
    for name, p in prompts.items():
        assert p.pieces["system"] == lp.MATH_SYSTEM_PROMPT
        assert p.pieces["question"] == q
        order = list(p.segments)
        if name == "w/o":
            assert "filler" not in p.segments
        else:  # filler between the system prompt and the question
            assert order.index("system") < order.index("filler") < order.index("question")
    assert prompts["w/ Mless"].pieces["filler"] == " ".join(["/"] * 55)
    assert prompts["w/ Mful"].pieces["filler"] == " ".join(["he"] * 55)
    n_mless = len(prompts["w/ Mless"].positions("filler"))
    assert len(prompts["random sentence"].positions("filler")) == n_mless
    assert prompts["random sentence"].pieces["filler"] != prompts["w/ Mless"].pieces["filler"]
    # the random sentence is fixed for a tokenizer, the same for every problem
    other = conds[3].prompt_builder(tiny)("Another question?")
    assert other.pieces["filler"] == prompts["random sentence"].pieces["filler"]


def test_condition_overrides_and_callables(tiny):
    c = builtin_condition("mless", system="Answer in \\boxed{}.")
    assert c.name == "w/ Mless" and c.prompt_builder(tiny)("q?").pieces["system"] == "Answer in \\boxed{}."

    def plain(model, question):
        return lp.build_prompt(model, question, chat=False)

    (custom,) = resolve_conditions(plain)
    assert custom.name == "plain"
    assert custom.prompt_builder(tiny)("What?").text == plain(tiny, "What?").text
    desc = custom.describe(tiny)
    assert desc["prompt_template"] == plain(tiny, "{question}").text
    # the fingerprint is stable across calls and changes with the prompt
    assert custom.fingerprint(tiny) == custom.fingerprint(tiny) != builtin_condition("w/o").fingerprint(tiny)
    bad = Condition("bad", build=lambda model, q: "not a prompt")
    with pytest.raises(lp.LensprobeError, match="must return a lensprobe Prompt"):
        bad.prompt_builder(tiny)("q")


def test_unknown_or_duplicate_condition():
    with pytest.raises(lp.LensprobeError, match=r"unknown condition 'w/ Mlss'.*built-in conditions"):
        resolve_conditions("w/o,w/ Mlss")
    with pytest.raises(lp.LensprobeError, match="unique"):
        resolve_conditions(["w/o", "none"])
    with pytest.raises(lp.LensprobeError, match="no conditions"):
        resolve_conditions("")
    with pytest.raises(lp.LensprobeError, match="one-line name"):
        Condition("")


# ----------------------------------------------------------------------------- statistics
@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (8, 10), (10, 10), (37, 120), (1, 1)])
def test_wilson_interval_solves_the_score_equation(k, n):
    # Oracle: the Wilson bounds are the p with (k/n - p)^2 = z^2 p (1 - p) / n.
    z = 1.959963984540054
    ph = k / n
    a, b, c = 1 + z * z / n, -(2 * ph + z * z / n), ph * ph
    roots = sorted(np.roots([a, b, c]).real)
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(max(0.0, roots[0]), abs=1e-12)
    assert hi == pytest.approx(min(1.0, roots[1]), abs=1e-12)
    assert lo <= ph <= hi


def test_wilson_textbook_value_and_bad_input():
    lo, hi = wilson_interval(8, 10)  # Newcombe (1998): 0.490 - 0.943
    assert (round(lo, 3), round(hi, 3)) == (0.49, 0.943)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    with pytest.raises(lp.LensprobeError, match="need 0 <= correct <= n, got correct=5, n=3"):
        wilson_interval(5, 3)


@pytest.mark.parametrize("b,c", [(0, 0), (1, 9), (3, 3), (5, 2), (0, 6), (4, 7)])
def test_mcnemar_exact_by_enumeration(b, c):
    # Oracle: enumerate every assignment of the m discordant pairs (fair coin each) and
    # count those at least as extreme as observed, in either direction.
    m = b + c
    if m == 0:
        assert mcnemar_exact(b, c) == 1.0
        return
    lo, hi = min(b, c), max(b, c)
    extreme = sum(1 for bits in itertools.product((0, 1), repeat=m) if sum(bits) <= lo or sum(bits) >= hi)
    assert mcnemar_exact(b, c) == pytest.approx(min(1.0, extreme / 2**m), abs=1e-12)


def _rows(verdicts: dict[str, list[bool]], levels=None):
    recs = []
    for cond, vs in verdicts.items():
        for i, v in enumerate(vs):
            recs.append({"condition": cond, "problem_id": f"p{i}", "sample": 0, "model": "m",
                         "level": (levels[i] if levels else 1), "subject": "S",
                         "math-verify": v, "paper": v, "paper-lenient": v})
    return pd.DataFrame.from_records(recs)


def test_accuracy_and_paired_comparison_by_hand():
    a = [True, False, False, True, False, False, True, False, False, False]
    b = [True, True, True, True, False, True, True, True, False, False]
    df = _rows({"w/o": a, "w/ Mless": b}, levels=[1, 1, 2, 2, 3, 3, 1, 2, 3, 1])
    acc = accuracy(df, "condition")
    assert acc["accuracy"].tolist() == [0.3, 0.7] and acc["n"].tolist() == [10, 10]
    assert (acc["low"].iloc[0], acc["high"].iloc[0]) == wilson_interval(3, 10)
    lv = accuracy(df, ["condition", "level"])
    row = lv[(lv["condition"] == "w/ Mless") & (lv["level"] == 3)].iloc[0]
    assert (row["correct"], row["n"]) == (1, 3)  # problems 4, 5, 8 -> F, T, F
    cmp = compare(df, "w/o", "w/ Mless")
    assert (cmp.only_a, cmp.only_b, cmp.n) == (0, 4, 10)
    assert cmp.difference == pytest.approx(0.4)
    assert cmp.p_value == pytest.approx(2 / 16)
    with pytest.raises(lp.LensprobeError, match="not in the results"):
        compare(df, "w/o", "w/ Mful")
    with pytest.raises(lp.LensprobeError, match="unknown grader"):
        accuracy(df, grader="exact")


def test_pass_at_k():
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # pass@1 is the plain fraction correct
    assert pass_at_k(7, 3, 1) == pytest.approx(3 / 7)


# ----------------------------------------------------------------------------- result folders
def test_partial_last_line_is_ignored_and_repaired(tmp_path):
    h1 = prepare_folder(tmp_path, {"x": 1}, {"c": {"hash": "a"}})["hash"]
    path = tmp_path / "results-rank0.jsonl"
    good = {"condition": "c", "problem_id": "p1", "sample": 0, "config_hash": h1, "condition_hash": "a"}
    path.write_text(row_line(good) + '{"condition": "c", "problem_id": "p2", "sa', encoding="utf-8")
    assert read_rows(tmp_path) == [good]
    assert len(load_results(tmp_path)) == 1
    with RowWriter(path) as w:  # a resumed run cuts the partial row before appending
        w.write({"condition": "c", "problem_id": "p2", "sample": 0})
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["problem_id"] for line in lines] == ["p1", "p2"]


def test_damaged_middle_line_is_an_error(tmp_path):
    h1 = prepare_folder(tmp_path, {"x": 1}, {"c": {"hash": "a"}})["hash"]
    row = row_line({"condition": "c", "problem_id": "p1", "sample": 0, "config_hash": h1, "condition_hash": "a"})
    (tmp_path / "results-rank0.jsonl").write_text(f"{row}not json\n{row}", encoding="utf-8")
    with pytest.raises(lp.LensprobeError, match="line 2 is not valid JSON"):
        read_rows(tmp_path)


def test_one_writer_per_results_file(tmp_path):
    path = tmp_path / "results-rank0.jsonl"
    with RowWriter(path):
        with pytest.raises(lp.LensprobeError, match="another process"):
            RowWriter(path)


def test_prepare_folder_refuses_other_configuration(tmp_path):
    prepare_folder(tmp_path, {"identity": IDENTITY_VERSION, "generation": {"max_new_tokens": 16}}, {"w/o": {"hash": "a"}})
    with pytest.raises(lp.LensprobeError, match=r"another 'evaluation' run:\n  generation\.max_new_tokens: folder has 16, this run has 32\n"):
        prepare_folder(tmp_path, {"identity": IDENTITY_VERSION, "generation": {"max_new_tokens": 32}}, {"w/o": {"hash": "a"}})
    with pytest.raises(lp.LensprobeError, match="different definition"):
        prepare_folder(tmp_path, {"identity": IDENTITY_VERSION, "generation": {"max_new_tokens": 16}}, {"w/o": {"hash": "b"}})
    # a new condition joins the folder
    prepare_folder(tmp_path, {"identity": IDENTITY_VERSION, "generation": {"max_new_tokens": 16}}, {"w/ Mful": {"hash": "c"}})
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert set(cfg["parts"]) == {"w/o", "w/ Mful"}
