"""The statistics' edges: groups in the order they first appear (``NaN`` keys kept), several group columns,
the messages that name a column or a group, repeated samples, empty tables, pairing by model and sample,
and the summary tables; each result checked against plain-Python counting over the same rows."""

import itertools
import math

import pandas as pd
import pytest

import lensprobe as lp
from lensprobe.evals.results.stats import (
    accuracy,
    avg_at_k,
    compare,
    mcnemar_exact,
    pass_at_k_table,
    summary_tables,
    wilson_interval,
)

FIELDS = ("condition", "problem_id", "sample", "level", "math-verify")
# "z" comes before "a", and problem q has no level: the groups' order and their NaN keys are visible
ROWS = [
    ("z", "p", 0, 1, True), ("z", "p", 1, 1, False), ("z", "q", 0, None, True), ("z", "q", 1, None, True),
    ("a", "p", 0, 1, False), ("a", "p", 1, 1, False), ("a", "q", 0, None, True), ("a", "q", 1, None, False),
]


def _frame(rows, fields=FIELDS):
    return pd.DataFrame([dict(zip(fields, r, strict=True)) for r in rows], columns=list(fields))


def _groups(rows, by):
    """The rows of each group by plain counting, in order of first appearance (a missing key is None)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        record = dict(zip(FIELDS, r, strict=True))
        groups.setdefault(tuple(record[c] for c in by), []).append(record)
    return groups


def _keys(table, by):
    """The group keys of a result table, NaN read as None."""
    return [tuple(None if pd.isna(v) else v for v in row) for row in table[by].itertuples(index=False, name=None)]


def _pass_by_subsets(verdicts, k):
    """pass@k as the share of all k-subsets of the samples holding a correct one."""
    subsets = list(itertools.combinations(verdicts, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("by", [["condition"], ["condition", "level"], "condition"])
def test_groups_come_in_order_of_first_appearance_with_nan_keys_kept(by):
    """Would catch ``sort`` or ``dropna`` dropped from the groupings (groups sorted, or the rows without a
    level left out), the group key wrapped twice, or a result column renamed."""
    cols = [by] if isinstance(by, str) else by
    groups = _groups(ROWS, cols)
    df = _frame(ROWS)
    acc = accuracy(df, by)
    assert list(acc.columns) == cols + ["n", "correct", "accuracy", "low", "high", "grader"]
    assert _keys(acc, cols) == list(groups)
    for (_, row), rows in zip(acc.iterrows(), groups.values(), strict=True):
        correct = sum(r["math-verify"] for r in rows)
        assert (row["n"], row["correct"], row["accuracy"]) == (len(rows), correct, correct / len(rows))
        assert (row["low"], row["high"], row["grader"]) == (*wilson_interval(correct, len(rows)), "math-verify")
    for k in (1, 2):
        table = pass_at_k_table(df, k, by)
        assert list(table.columns) == cols + ["k", "problems", "samples", f"pass@{k}", "avg", "grader"]
        assert _keys(table, cols) == list(groups)
        for (_, row), rows in zip(table.iterrows(), groups.values(), strict=True):
            per_problem = _groups([tuple(r.values()) for r in rows], ["problem_id"]).values()
            verdicts = [[r["math-verify"] for r in p] for p in per_problem]
            assert (row["k"], row["problems"], row["samples"], row["grader"]) == (k, len(verdicts), len(rows),
                                                                                   "math-verify")
            assert row[f"pass@{k}"] == pytest.approx(sum(_pass_by_subsets(v, k) for v in verdicts) / len(verdicts))
            assert row["avg"] == pytest.approx(sum(sum(v) / len(v) for v in verdicts) / len(verdicts))
    table = avg_at_k(df, 2, by)
    assert list(table.columns) == cols + ["k", "problems", "avg@2", "min", "max", "grader"]
    assert _keys(table, cols) == list(groups)
    for (_, row), rows in zip(table.iterrows(), groups.values(), strict=True):
        runs = [sum(r["math-verify"] for r in rows if r["sample"] == j) / len({r["problem_id"] for r in rows})
                for j in range(2)]
        assert (row["k"], row["problems"], row["grader"]) == (2, len({r["problem_id"] for r in rows}), "math-verify")
        assert (row["avg@2"], row["min"], row["max"]) == pytest.approx((sum(runs) / 2, min(runs), max(runs)))


def test_a_group_without_any_verdict_has_no_accuracy_and_confidence_is_passed_on():
    """Would catch rows without a verdict counted as trials, or the interval's level not passed on."""
    df = _frame([("a", "p", 0, 1, True), ("a", "q", 0, 1, None), ("a", "r", 0, 1, False), ("b", "p", 0, 1, None)])
    acc = accuracy(df, "condition", confidence=0.8)
    a, b = acc.iloc[0], acc.iloc[1]
    assert (a["n"], a["correct"], a["accuracy"]) == (2, 1, 0.5)
    assert (a["low"], a["high"]) == wilson_interval(1, 2, 0.8) != wilson_interval(1, 2)
    assert (b["n"], b["correct"]) == (0, 0) and all(math.isnan(b[c]) for c in ("accuracy", "low", "high"))


def test_accuracy_with_k_passes_its_groups_and_grader_on():
    """Would catch ``accuracy(..., k=)`` counting pass@k over the default groups or the default grader."""
    df = _frame(ROWS).assign(paper=lambda d: ~d["math-verify"].astype(bool))
    table = accuracy(df, ["condition", "level"], grader="paper", k=2)
    groups = _groups(ROWS, ["condition", "level"])
    assert _keys(table, ["condition", "level"]) == list(groups) and table["grader"].unique().tolist() == ["paper"]
    want = [_pass_by_subsets([not r["math-verify"] for r in rows], 2) for rows in groups.values()]  # one problem each
    assert table["pass@2"].tolist() == pytest.approx(want)


@pytest.mark.unchecked
def test_missing_columns_are_named_with_the_columns_there_are():
    """Would catch the check for missing columns skipped (a pandas KeyError instead) or its message emptied."""
    df = _frame(ROWS)
    there = r"\['condition', 'problem_id', 'level', 'math-verify'\]"
    with pytest.raises(lp.LensprobeError, match=rf"^avg@k needs columns \['sample'\]: the table has columns {there}\."):
        avg_at_k(df.drop(columns="sample"), 1)
    there = r"\['condition', 'sample', 'level', 'math-verify'\]"
    with pytest.raises(lp.LensprobeError, match=rf"^pass@k needs columns \['subject', 'problem_id'\]: the table has "
                                                rf"columns {there}\."):
        pass_at_k_table(df.drop(columns="problem_id"), 1, ["condition", "subject"])
    with pytest.raises(lp.LensprobeError, match=r"^cannot group by \['subject'\]: the table has columns \['condition'"):
        accuracy(df, ["subject", "condition"])


def test_avg_at_k_refuses_a_problem_without_exactly_its_k_samples():
    """Would catch the two checks of avg@k joined by ``and`` (either alone lets a bad table through)."""
    fields = ("condition", "problem_id", "sample", "math-verify")
    # p has sample 1 twice: 5 rows where 4 are due, yet each problem has samples 0 and 1
    extra = _frame([("a", "p", 0, True), ("a", "p", 1, False), ("a", "p", 1, True), ("a", "q", 0, True),
                    ("a", "q", 1, False)], fields)
    with pytest.raises(lp.LensprobeError, match=r"condition='a' has 5 of 4\."):
        avg_at_k(extra, 2)
    # p has sample 0 twice and no sample 1: 4 rows as due, but p lacks a run
    swapped = _frame([("a", "p", 0, True), ("a", "p", 0, False), ("a", "q", 0, True), ("a", "q", 1, False)], fields)
    with pytest.raises(lp.LensprobeError, match=r"condition='a' has 4 of 4\."):
        avg_at_k(swapped, 2)


def test_messages_name_every_column_of_the_group():
    """Would catch the group in a message joined wrongly, its values lost, or the count due divided by k."""
    df = _frame([("a", "p", 0, 2, True), ("a", "p", 1, 2, False), ("a", "q", 0, 2, True),
                 ("a", "q", 2, 2, True), ("z", "p", 0, 1, True), ("z", "p", 1, 1, True)])
    with pytest.raises(lp.LensprobeError, match=r"samples 0-1 of every problem with a 'math-verify' verdict: "
                                                r"condition='a', level=2 has 3 of 4\. Run n_samples >= 2"):
        avg_at_k(df, 2, ["condition", "level"])
    short = df.drop(index=3)  # q has one sample
    with pytest.raises(lp.LensprobeError, match=r"problem 'q' \(condition='a', level=2\) has n=1\. Generate"):
        pass_at_k_table(short, 2, ["condition", "level"])


def test_the_first_short_problem_in_table_order_is_named_by_its_id():
    """Would catch the problems of a group sorted before the check (the message names another problem)."""
    df = pd.DataFrame({"condition": "a", "model": "m", "problem_id": ["z-short", "full", "full", "a-short"],
                       "sample": [0, 0, 1, 0], "math-verify": [True, False, True, False]})
    with pytest.raises(lp.LensprobeError, match=r"problem 'z-short' \(condition='a'\) has n=1"):
        pass_at_k_table(df, 2)


def test_rows_without_a_model_are_a_problem_of_their_own():
    """Would catch the per-problem grouping dropping a NaN key (those rows' problem would be lost)."""
    df = pd.DataFrame({"condition": "a", "model": ["m", "m", None, None], "problem_id": "p", "sample": [0, 1, 0, 1],
                       "math-verify": [True, True, False, False]})
    row = pass_at_k_table(df, 2).iloc[0]
    assert (row["problems"], row["samples"], row["pass@2"], row["avg"]) == (2, 4, (1.0 + 0.0) / 2, (1.0 + 0.0) / 2)


def test_a_repeated_sample_is_refused_even_with_another_verdict():
    """Would catch the repeated-sample check comparing whole rows (two verdicts for one sample pass) or
    counting one row of each repeated pair."""
    df = _frame([("a", "p", 0, 1, True), ("a", "p", 0, 1, False), ("a", "p", 1, 1, True), ("b", "p", 0, 1, True)])
    with pytest.raises(lp.LensprobeError, match=r"problem 'p' has sample 0 more than once in one group "
                                                r"\(2 repeated rows\)"):
        pass_at_k_table(df, 1)
    assert pass_at_k_table(df[df["condition"] == "b"], 1)["pass@1"].tolist() == [1.0]


def test_empty_tables_keep_their_columns():
    """Would catch the result columns left to the records (an empty table would have none)."""
    empty = _frame([])
    assert list(avg_at_k(empty, 3).columns) == ["condition", "k", "problems", "avg@3", "min", "max", "grader"]
    assert list(pass_at_k_table(empty, 2).columns) == ["condition", "k", "problems", "samples", "pass@2", "avg",
                                                       "grader"]
    assert list(accuracy(empty, ["condition", "level"]).columns) == ["condition", "level", "n", "correct",
                                                                     "accuracy", "low", "high", "grader"]


def _paired(cells):
    """Rows of conditions a and b over models and samples: ``cells`` maps (model, problem, sample) to the
    verdicts (under a, under b); ``...`` leaves the row out, None is a row without a verdict."""
    rows = []
    for (model, pid, sample), verdicts in cells.items():
        for cond, v in zip("ab", verdicts, strict=True):
            if v is not ...:
                rows.append({"condition": cond, "model": model, "problem_id": pid, "sample": sample,
                             "math-verify": v})
    return pd.DataFrame(rows)


def test_compare_pairs_rows_by_model_problem_and_sample():
    """Would catch ``model`` or ``sample`` left out of the keys rows are paired on: every row of a problem
    would pair with every row of the other condition, across models or samples), a pair without a verdict
    under one condition kept, or the refusals' messages emptied."""
    cells = {("m1", "p", 0): (True, False), ("m1", "p", 1): (True, True), ("m2", "p", 0): (False, True),
             ("m2", "p", 1): (False, False), ("m2", "q", 0): (True, ...), ("m1", "q", 0): (False, True),
             ("m1", "q", 1): (None, True), ("m1", "r", 0): (False, None)}
    pairs = [v for v in cells.values() if None not in v and ... not in v]  # by hand: the cells with both verdicts
    cmp = compare(_paired(cells), "a", "b")
    only_a, only_b = sum(a and not b for a, b in pairs), sum(b and not a for a, b in pairs)
    assert (cmp.n, cmp.only_a, cmp.only_b) == (len(pairs), only_a, only_b) == (5, 1, 2)
    assert (cmp.accuracy_a, cmp.accuracy_b) == (2 / 5, 3 / 5)
    assert cmp.p_value == mcnemar_exact(1, 2) == 1.0
    # one model, one sample: two problems, both lost under b
    single = compare(_paired({("m", "p", 0): (True, False), ("m", "q", 0): (True, False)}), "a", "b")
    assert (single.n, single.only_a, single.only_b) == (2, 2, 0)
    unanswered = _paired({("m", "p", 0): (True, None), ("m", "q", 0): (..., False), ("m", "r", 0): (None, ...)})
    with pytest.raises(lp.LensprobeError, match=r"^conditions 'a' and 'b' share no answered problems"):
        compare(unanswered, "a", "b")
    with pytest.raises(lp.LensprobeError, match=r"^condition 'c' is not in the results: they hold \['a', 'b'\]\."):
        compare(unanswered, "a", "c")


def test_compare_refuses_rows_it_cannot_pair():
    """Without ``problem_id`` rows would pair by sample alone (every problem with every other), and rows
    repeating a problem and sample would pair with each other's duplicates: both refused, naming why."""
    rows = _paired({("m", "p", 0): (True, False), ("m", "q", 0): (False, True)})
    with pytest.raises(lp.LensprobeError, match=r"pairs rows by problem_id, which the results lack"):
        compare(rows.drop(columns=["problem_id"]), "a", "b")
    with pytest.raises(lp.LensprobeError, match=r"condition 'b' has several rows for the same model, problem_id\b"):
        compare(rows.drop(columns=["sample"]).pipe(lambda d: pd.concat([d, d[d["condition"] == "b"]])), "a", "b")
    with pytest.raises(lp.LensprobeError, match=r"condition 'a' has several rows for the same model, problem_id, "
                                                 r"sample"):
        compare(pd.concat([rows, rows[rows["condition"] == "a"]]), "a", "b")


@pytest.mark.unchecked
def test_mcnemar_refuses_negative_counts():
    """Would catch one of the two counts left unchecked."""
    for counts in ((-1, 3), (3, -1)):
        with pytest.raises(lp.LensprobeError, match=r"^discordant counts must be non-negative\.$"):
            mcnemar_exact(*counts)
    assert mcnemar_exact(0, 3) == 2 * 1 / 8  # by hand: both extreme outcomes of 3 fair coins


SUMMARY_FIELDS = ("model", "condition", "problem_id", "level", "subject", "math-verify", "paper", "paper-exact")


def _summary_rows():
    """Model m2 comes first; conditions in the order base, x, y; problem r has no level or subject, and no
    row has a paper-exact verdict."""
    verdicts = {("m2", "base"): "TTF", ("m2", "x"): "TFF", ("m2", "y"): "FFT",
                ("m1", "base"): "FFF", ("m1", "x"): "TTT", ("m1", "y"): "TFT"}
    rows = []
    for (model, cond), marks in verdicts.items():
        for pid, level, subject, mark in zip("pqr", (1, 2, None), ("S", "T", None), marks, strict=True):
            ok = mark == "T"
            rows.append((model, cond, pid, level, subject, ok, not ok, None))
    return pd.DataFrame(rows, columns=list(SUMMARY_FIELDS)).assign(sample=0)


def test_summary_tables_by_hand():
    """Would catch the models or conditions reordered, a verdict column without verdicts kept, the
    per-level and per-subject tables counting rows without a level or subject, or the baseline ignored."""
    rows = _summary_rows()
    tables = summary_tables(rows)
    acc = tables["accuracy"]
    assert acc["grader"].tolist() == ["math-verify"] * 6 + ["paper"] * 6  # paper-exact has no verdict
    assert _keys(acc, ["model", "condition"])[:6] == [("m2", "base"), ("m2", "x"), ("m2", "y"),
                                                      ("m1", "base"), ("m1", "x"), ("m1", "y")]
    assert acc["correct"].tolist() == [2, 1, 1, 0, 3, 2] + [1, 2, 2, 3, 0, 1]
    levels = tables["by_level"]
    assert _keys(levels, ["model", "condition", "level"])[:2] == [("m2", "base", 1), ("m2", "base", 2)]
    assert len(levels) == 12 and levels["n"].tolist() == [1] * 12  # r (no level) left out
    subjects = tables["by_subject"]
    assert subjects["subject"].tolist() == ["S", "T"] * 6 and subjects["grader"].unique().tolist() == ["math-verify"]
    cmp = tables["comparisons"]
    assert list(cmp.columns) == ["model", "a", "b", "n", "accuracy_a", "accuracy_b", "only_a", "only_b", "p_value",
                                 "grader", "difference"]
    assert _keys(cmp, ["model", "a", "b", "grader"]) == [
        ("m2", "base", "x", "math-verify"), ("m2", "base", "x", "paper"), ("m2", "base", "y", "math-verify"),
        ("m2", "base", "y", "paper"), ("m1", "base", "x", "math-verify"), ("m1", "base", "x", "paper"),
        ("m1", "base", "y", "math-verify"), ("m1", "base", "y", "paper")]
    # m2, base TTF vs y FFT: only base on p and q, only y on r
    assert cmp[["n", "only_a", "only_b"]].iloc[2].tolist() == [3, 2, 1]
    assert cmp["difference"].iloc[2] == pytest.approx(1 / 3 - 2 / 3)
    against_x = summary_tables(rows, grader="paper", baseline="x")["comparisons"]
    assert _keys(against_x, ["model", "a", "b"])[:2] == [("m2", "x", "base"), ("m2", "x", "base")]
    by_paper = summary_tables(rows, grader="paper")
    assert [by_paper[t]["grader"].unique().tolist() for t in ("by_level", "by_subject")] == [["paper"]] * 2
    assert by_paper["by_subject"]["correct"].tolist()[:2] == [0, 0]  # m2, base: p and q right, so wrong by paper


def test_summary_tables_leave_out_what_is_not_there():
    """Would catch the per-level or per-subject table made without any level or subject, a missing
    baseline or an empty table not refused."""
    rows = _summary_rows().assign(level=None, subject=None)
    tables = summary_tables(rows)
    assert set(tables) == {"accuracy", "comparisons"}
    # paper-exact only for m1, and there only on p and q: compared for m1 alone, on its two pairs
    m1_pq = (rows["model"] == "m1") & rows["problem_id"].isin(["p", "q"])
    rows["paper-exact"] = rows["math-verify"].where(m1_pq, None)
    tables = summary_tables(rows)
    acc = tables["accuracy"]
    assert acc.index.tolist() == list(range(18)) and acc["grader"].unique().tolist() == ["math-verify", "paper",
                                                                                         "paper-exact"]
    assert acc[acc["grader"] == "paper-exact"]["n"].tolist() == [0, 0, 0, 2, 2, 2]
    cmp = tables["comparisons"]
    assert cmp.groupby("model", sort=False).size().to_dict() == {"m2": 4, "m1": 6}
    assert cmp[cmp["grader"] == "paper-exact"]["n"].tolist() == [2, 2]
    with pytest.raises(lp.LensprobeError, match=r"^baseline condition 'w/ Mful' is not in the results "
                                                r"\(\['base', 'x', 'y'\]\)\."):
        summary_tables(rows, baseline="w/ Mful")
    with pytest.raises(lp.LensprobeError, match=r"^no result rows to summarise: run an evaluation first\."):
        summary_tables(rows.iloc[:0])
