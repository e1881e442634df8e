"""pass@k: the unbiased estimator against brute-force enumeration, and the per-problem table."""

import itertools
import random
from fractions import Fraction

import pandas as pd
import pytest

import lensprobe as lp
from lensprobe.evals import accuracy, pass_at_k, pass_at_k_table


def brute_force(verdicts: list[bool], k: int) -> Fraction:
    """The fraction of all k-subsets of the samples that hold at least one correct sample."""
    subsets = list(itertools.combinations(range(len(verdicts)), k))
    hits = sum(any(verdicts[i] for i in subset) for subset in subsets)
    return Fraction(hits, len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_matches_enumeration_of_all_subsets(n):
    for c in range(n + 1):
        verdicts = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == float(brute_force(verdicts, k)), (n, c, k)


def test_by_hand():
    # 5 samples, 2 correct, k = 2: 1 - C(3, 2) / C(5, 2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == 0.7
    # the authors' setting: pass@3 from 20 samples; 1 correct -> 1 - C(19,3)/C(20,3) = 3/20
    assert pass_at_k(20, 1, 3) == 0.15
    assert pass_at_k(20, 5, 3) == float(1 - Fraction(455, 1140))
    assert pass_at_k(7, 3, 1) == pytest.approx(3 / 7)


def test_edge_cases():
    assert pass_at_k(20, 0, 3) == 0.0  # c = 0
    assert pass_at_k(20, 20, 3) == 1.0  # c = n
    assert pass_at_k(20, 18, 3) == 1.0  # n - c < k: every 3-subset holds a correct sample
    assert pass_at_k(3, 1, 3) == 1.0
    assert pass_at_k(1000, 1, 1) == 0.001  # large n stays exact


@pytest.mark.unchecked
def test_scalar_errors():
    with pytest.raises(lp.LensprobeError, match=r"1 <= k <= n, got n=2, c=1, k=3"):
        pass_at_k(2, 1, 3)
    with pytest.raises(lp.LensprobeError, match=r"0 <= c <= n"):
        pass_at_k(2, 3, 1)
    with pytest.raises(lp.LensprobeError, match=r"integer counts, got k=1.5"):
        pass_at_k(4, 1, 1.5)
    with pytest.raises(lp.LensprobeError, match=r"1 <= k <= n, got n=4, c=1, k=0\."):
        pass_at_k(4, 1, 0)  # pass@0 is no estimate (the formula would say 0.0)
    for name, args in (("n", (4.0, 1, 1)), ("c", (4, True, 1))):  # each count named by its own name
        with pytest.raises(lp.LensprobeError, match=rf"^pass@k needs integer counts, got {name}="):
            pass_at_k(*args)


def _rows(samples: dict[str, list[bool]], condition: str = "w/o", **extra) -> list[dict]:
    return [{"condition": condition, "problem_id": pid, "sample": j, "math-verify": v, "paper": v, **extra}
            for pid, verdicts in samples.items() for j, v in enumerate(verdicts)]


def test_table_averages_over_problems():
    rng = random.Random(0)
    samples = {f"p{i}": [rng.random() < 0.3 for _ in range(6 + i % 3)] for i in range(7)}
    other = {"p0": [True] * 4, "p1": [False] * 4}
    df = pd.DataFrame(_rows(samples) + _rows(other, "w/ Mless"))
    for k in (1, 2, 3, 4):
        table = pass_at_k_table(df, k, "condition")
        want = sum(brute_force(v, k) for v in samples.values()) / len(samples)
        got = table.set_index("condition").loc["w/o"]
        assert got[f"pass@{k}"] == pytest.approx(float(want), abs=1e-15)
        assert (got["problems"], got["samples"], got["k"]) == (7, sum(map(len, samples.values())), k)
        assert table.set_index("condition").loc["w/ Mless", f"pass@{k}"] == 0.5
    via_accuracy = accuracy(df, "condition", k=3)
    pd.testing.assert_frame_equal(via_accuracy, pass_at_k_table(df, 3, "condition"))
    assert list(via_accuracy.columns) == ["condition", "k", "problems", "samples", "pass@3", "avg", "grader"]
    # avg: each problem's share of correct samples, averaged over problems (by hand over the rows)
    shares = [sum(v) / len(v) for v in samples.values()]
    assert via_accuracy.set_index("condition").loc["w/o", "avg"] == pytest.approx(sum(shares) / len(shares))
    # pass@1 with equal sample counts is the plain accuracy
    even = pd.DataFrame(_rows({"a": [True, False, False, False], "b": [True, True, False, True]}))
    assert accuracy(even, k=1)["pass@1"].iloc[0] == accuracy(even)["accuracy"].iloc[0] == 0.5


def test_models_are_separate_problems():
    df = pd.DataFrame(_rows({"p": [True, False, False]}, model="m1") + _rows({"p": [False, False, False]}, model="m2"))
    # pooled, p would have n=6, c=1 (pass@3 = 0.5); as two problems: (1 - 0/1... ) -> (1.0 + 0.0) / 2
    assert pass_at_k_table(df, 3)["pass@3"].iloc[0] == 0.5
    assert pass_at_k_table(df, 2)["pass@2"].iloc[0] == pytest.approx((2 / 3 + 0) / 2)
    by_model = pass_at_k_table(df, 2, ["model", "condition"]).set_index("model")["pass@2"]
    assert by_model["m1"] == pytest.approx(2 / 3) and by_model["m2"] == 0.0


def test_k_larger_than_n_names_the_problem():
    df = pd.DataFrame(_rows({"p-full": [True] * 20, "p-short": [False, True]}))
    with pytest.raises(lp.LensprobeError,
                       match=r"pass@3 needs at least 3 samples per problem: problem 'p-short' "
                             r"\(condition='w/o'\) has n=2\. Generate more samples"):
        accuracy(df, "condition", k=3)
    assert pass_at_k_table(df, 2)["pass@2"].iloc[0] == 1.0


def test_table_errors():
    df = pd.DataFrame(_rows({"p": [True, False, True]}))
    with pytest.raises(lp.LensprobeError, match=r"k must be a positive integer"):
        pass_at_k_table(df, 0)
    with pytest.raises(lp.LensprobeError, match=r"k must be a positive integer"):
        accuracy(df, k=True)
    with pytest.raises(lp.LensprobeError, match=r"needs columns \['level'\]"):
        pass_at_k_table(df, 1, "level")
    with pytest.raises(lp.LensprobeError, match=r"unknown grader"):
        pass_at_k_table(df, 1, grader="exact")
    dup = pd.DataFrame(_rows({"p": [True, False]}) * 2)
    with pytest.raises(lp.LensprobeError, match=r"problem 'p' has sample 0 more than once"):
        pass_at_k_table(dup, 1)
    gaps = df.astype({"math-verify": object})
    gaps.loc[1, "math-verify"] = None
    with pytest.raises(lp.LensprobeError, match=r"1 row\(s\) have no 'math-verify' verdict"):
        pass_at_k_table(gaps, 1)
