"""Statistics over graded result rows: accuracy with Wilson intervals, paired McNemar tests, pass@k.

All functions take the result table of :func:`lensprobe.evals.running.harness.evaluate` (or
:func:`lensprobe.evals.results.folder.load_results`): one row per (condition, problem, sample)
with a boolean column per grader (``"math-verify"``, ``"paper"``, ``"paper-lenient"``) and the
authors' ``"paper-exact"``. Every function takes ``grader=`` as any of these columns (or a column of
booleans you added); ``None`` counts the table's default (``paper-exact`` for folders evaluated in the
authors' format, else ``math-verify``: :mod:`lensprobe.evals.results.verdicts`).
"""

import math
from dataclasses import asdict, dataclass
from fractions import Fraction

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import pandas
from lensprobe.core.measures.intervals import wilson_interval
from lensprobe.evals.results.rows_check import check_verdict_column
from lensprobe.evals.results.verdicts import resolve_grader, verdict_columns


def accuracy(df, by: str | list[str] = "condition", *, grader: str | None = None,
             confidence: float = 0.95, k: int | None = None):
    """Accuracy per group with a Wilson interval, or with ``k`` the mean pass@k over problems.

    Args:
        df: result rows (a pandas DataFrame).
        by: column(s) to group by, e.g. ``"condition"``, ``["condition", "level"]``,
            ``["model", "condition"]``.
        grader: which verdict column to count (``"math-verify"``, ``"paper"``,
            ``"paper-lenient"``, ``"paper-exact"``, or a column of booleans you added);
            ``None``: the table's default (:func:`~lensprobe.evals.results.verdicts.resolve_grader`).
        confidence: interval level (0.95 by default).
        k: ``None`` for accuracy; an int for the unbiased pass@k estimate per problem,
            ``1 - C(n - c, k) / C(n, k)`` (n samples, c correct), averaged over problems
            (:func:`pass_at_k_table`; every problem needs at least ``k`` samples).

    Returns:
        A DataFrame with the group columns and ``n``, ``correct``, ``accuracy``, ``low``,
        ``high``, ``grader``. With several samples per problem every sample counts as a
        trial (the mean accuracy over samples). Rows without a verdict (``None``: a
        generation stopped at non-finite logits, ``finish="nonfinite"``, or a row that could
        not run, ``finish="error"``) are not trials. With ``k``: the group columns and ``k``,
        ``problems``, ``samples``, ``pass@{k}``, ``grader``.

    Example:
        >>> accuracy(rows, ["condition", "level"])
        >>> accuracy(rows, "condition", k=3)   # pass@3, e.g. from 20 samples per problem
    """
    if k is not None:
        return pass_at_k_table(df, k, by, grader=grader)
    pd = pandas()
    grader = resolve_grader(df, grader)
    check_verdict_column(df, grader)  # 'False', 0, 0.5 are refused, never counted
    by = [by] if isinstance(by, str) else list(by)
    missing = [c for c in by if c not in df.columns]
    if missing:
        raise LensprobeError(f"cannot group by {missing}: the table has columns {list(df.columns)}.")
    records = []
    for key, group in df.groupby(by, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        graded = group[grader][group[grader].notna()]  # no verdict: a broken generation, left out
        n = len(graded)
        k = int(graded.astype(bool).sum())
        lo, hi = wilson_interval(k, n, confidence)
        records.append({**dict(zip(by, key, strict=True)), "n": n, "correct": k, "accuracy": k / n if n else math.nan,
                        "low": lo, "high": hi, "grader": grader})
    return pd.DataFrame.from_records(records, columns=by + ["n", "correct", "accuracy", "low", "high", "grader"])


@dataclass(frozen=True)
class PairedComparison:
    """McNemar exact test between two conditions on the same (problem, sample) pairs.

    Attributes:
        a, b: condition names.
        n: number of pairs compared.
        accuracy_a, accuracy_b: accuracies on those pairs.
        only_a: pairs right under ``a`` and wrong under ``b``.
        only_b: pairs right under ``b`` and wrong under ``a``.
        p_value: two-sided exact McNemar p-value (binomial test of ``only_a`` vs
            ``only_b`` with p = 1/2); 1.0 when there are no discordant pairs.
    """

    a: str
    b: str
    n: int
    accuracy_a: float
    accuracy_b: float
    only_a: int
    only_b: int
    p_value: float
    grader: str

    @property
    def difference(self) -> float:
        """``accuracy_b - accuracy_a``."""
        return self.accuracy_b - self.accuracy_a

    def to_dict(self) -> dict:
        return {**asdict(self), "difference": self.difference}


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value from the two discordant counts.

    Example:
        >>> round(mcnemar_exact(1, 9), 4)
        0.0215
    """
    if only_a < 0 or only_b < 0:
        raise LensprobeError("discordant counts must be non-negative.")
    m = only_a + only_b
    if m == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(m, i) for i in range(k + 1)) / 2**m
    return min(1.0, 2 * tail)


def compare(df, a: str, b: str, *, grader: str | None = None) -> PairedComparison:
    """Paired comparison of conditions ``a`` and ``b`` on the problems both have answered.

    Rows are paired by ``(problem_id, sample)`` (and ``model`` if present); pairs missing
    under either condition, or without a verdict there (a broken generation), are left out.

    ``grader`` is any verdict column (``None``: the table's default, e.g. ``paper-exact`` for a
    folder in the authors' format).

    Example:
        >>> cmp = compare(rows, "w/o", "w/ Mless", grader="paper-exact")
        >>> cmp.difference, cmp.p_value
    """
    grader = resolve_grader(df, grader)
    check_verdict_column(df, grader)  # 'False', 0, 0.5 are refused, never counted
    conds = set(df["condition"])
    for name in (a, b):
        if name not in conds:
            raise LensprobeError(f"condition {name!r} is not in the results: they hold {sorted(conds)}.")
    if "problem_id" not in df.columns:
        raise LensprobeError(f"compare pairs rows by problem_id, which the results lack (they have {list(df.columns)}): "
                             "pass rows with a problem_id column (as lp.evaluate writes them).")
    keys = [c for c in ("model", "problem_id", "sample") if c in df.columns]
    left = df[df["condition"] == a][keys + [grader]].rename(columns={grader: "va"})
    right = df[df["condition"] == b][keys + [grader]].rename(columns={grader: "vb"})
    for name, side in ((a, left), (b, right)):
        if side.duplicated(keys).any():
            raise LensprobeError(f"condition {name!r} has several rows for the same {', '.join(keys)}: pairs would be "
                                 "ambiguous. Keep one row per problem and sample (a 'sample' column tells samples apart).")
    pairs = left.merge(right, on=keys, how="inner")
    pairs = pairs[pairs["va"].notna() & pairs["vb"].notna()]
    n = len(pairs)
    if n == 0:
        raise LensprobeError(f"conditions {a!r} and {b!r} share no answered problems: nothing to compare.")
    va, vb = pairs["va"].astype(bool), pairs["vb"].astype(bool)
    only_a, only_b = int((va & ~vb).sum()), int((vb & ~va).sum())
    return PairedComparison(a=a, b=b, n=n, accuracy_a=float(va.mean()), accuracy_b=float(vb.mean()),
                            only_a=only_a, only_b=only_b, p_value=mcnemar_exact(only_a, only_b),
                            grader=grader)


def _plain(value):
    """A numpy scalar as the Python value, for messages."""
    return value.item() if hasattr(value, "item") else value


def _check_k(k) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise LensprobeError(f"k must be a positive integer (pass@k over k of a problem's samples), got {k!r}.")
    return k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate from ``n`` samples of which ``c`` are correct (Chen et al. 2021).

    ``1 - C(n - c, k) / C(n, k)``: the probability that ``k`` samples drawn without replacement
    from the ``n`` include a correct one; 1.0 when ``n - c < k``. Computed exactly with integer
    binomials and rounded once to a float.

    Raises:
        LensprobeError: unless ``0 <= c <= n`` and ``1 <= k <= n``.

    Example:
        >>> pass_at_k(n=4, c=1, k=2)
        0.5
        >>> pass_at_k(n=20, c=1, k=3)   # the authors' pass@3 from 20 samples
        0.15
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise LensprobeError(f"pass@k needs integer counts, got {name}={value!r}.")
    if not 0 <= c <= n or k <= 0 or k > n:
        raise LensprobeError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}.")
    if n - c < k:
        return 1.0
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def pass_at_k_table(df, k: int, by: str | list[str] = "condition", *, grader: str | None = None):
    """Mean pass@k over problems per group: :func:`pass_at_k` per problem, then the mean.

    A problem is one ``problem_id`` (per ``model`` too, when the table has a ``model`` column
    that is not in ``by``); its ``n`` is its number of rows (samples) in the group and ``c``
    the number the grader marks correct. Problems may have different ``n``.

    Args:
        df: result rows (a pandas DataFrame) with ``problem_id`` and the grader's column.
        k: samples per draw (the authors report pass@3 from 20 samples).
        by: column(s) to group by.
        grader: which verdict column counts as correct (``None``: the table's default).

    Returns:
        A DataFrame with the group columns and ``k``, ``problems``, ``samples`` (rows),
        ``pass@{k}``, ``avg`` (the mean over problems of ``c / n``: the accuracy of one sample
        averaged over every run, as the paper's Table 1 averages five runs; see
        :func:`avg_at_k`), ``grader``.

    Raises:
        LensprobeError: a problem has fewer than ``k`` samples (the message names it and its
            ``n``), a ``(problem, sample)`` pair repeats, a verdict is missing, or a column is
            missing.

    Example:
        >>> pass_at_k_table(rows, k=3, by="condition")
    """
    pd = pandas()
    k = _check_k(k)
    grader = resolve_grader(df, grader)
    check_verdict_column(df, grader)  # 'False', 0, 0.5 are refused, never counted
    by = [by] if isinstance(by, str) else list(by)
    missing = [c for c in by + ["problem_id"] if c not in df.columns]
    if missing:
        raise LensprobeError(f"pass@k needs columns {missing}: the table has columns {list(df.columns)}.")
    if df[grader].isna().any():
        raise LensprobeError(f"{int(df[grader].isna().sum())} row(s) have no {grader!r} verdict (finish "
                             "'nonfinite': their generation broke; 'error': they could not run): drop them, e.g. "
                             f"rows[rows[{grader!r}].notna()], before computing pass@k.")
    unit = by + [c for c in ("model",) if c in df.columns and c not in by] + ["problem_id"]
    if "sample" in df.columns:
        repeated = df[df.duplicated(unit + ["sample"], keep=False)]
        if len(repeated):
            first = repeated.iloc[0]
            raise LensprobeError(
                f"problem {_plain(first['problem_id'])!r} has sample {_plain(first['sample'])!r} more than once in one group "
                f"({len(repeated)} repeated rows): each (problem, sample) must appear once; drop the duplicates "
                f"or group by the column that tells them apart."
            )
    columns = by + ["k", "problems", "samples", f"pass@{k}", "avg", "grader"]
    records = []
    for key, group in df.groupby(by, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        where = ", ".join(f"{col}={_plain(val)!r}" for col, val in zip(by, key, strict=True))
        per_problem = group.groupby(unit[len(by):], sort=False, dropna=False)[grader]
        values, means = [], []
        for pkey, verdicts in per_problem:
            n, c = len(verdicts), int(verdicts.astype(bool).sum())
            if n < k:
                pid = _plain(pkey[-1] if isinstance(pkey, tuple) else pkey)
                raise LensprobeError(
                    f"pass@{k} needs at least {k} samples per problem: problem {pid!r} ({where}) has n={n}. "
                    f"Generate more samples (n_samples >= {k}) or lower k."
                )
            values.append(pass_at_k(n, c, k))
            means.append(c / n)
        records.append({**dict(zip(by, key, strict=True)), "k": k, "problems": len(values),
                        "samples": len(group), f"pass@{k}": sum(values) / len(values),
                        "avg": sum(means) / len(means), "grader": grader})
    return pd.DataFrame.from_records(records, columns=columns)


def conditions_in_order(rows) -> list[str]:
    return list(dict.fromkeys(rows["condition"]))


def summary_tables(rows, *, grader: str | None = None, baseline: str | None = None) -> dict:
    """Accuracy tables and paired comparisons from result rows.

    Args:
        rows: result rows (from :func:`~lensprobe.evals.running.harness.evaluate` or
            :func:`~lensprobe.evals.results.folder.load_results`), possibly of several models.
        grader: verdict column of the per-level/per-subject tables and the figures (``None``:
            the table's default, ``paper-exact`` for folders in the authors' format).
        baseline: condition every other condition is compared with (default: the first).

    Returns:
        ``{"accuracy": every verdict column per model x condition, "by_level": ...,
        "by_subject": ..., "comparisons": McNemar tests vs the baseline per model and verdict
        column}`` (DataFrames). Verdict columns without any verdict (``paper-exact`` in rows
        written before it existed) are left out of the accuracy and comparison tables.
    """
    pd = pandas()
    if len(rows) == 0:
        raise LensprobeError("no result rows to summarise: run an evaluation first.")
    grader = resolve_grader(rows, grader)
    graders = list(dict.fromkeys([grader, *verdict_columns(rows)]))
    group = ["model", "condition"]
    tables = {"accuracy": pd.concat([accuracy(rows, group, grader=g) for g in graders], ignore_index=True)}
    if rows["level"].notna().any():
        tables["by_level"] = accuracy(rows[rows["level"].notna()], group + ["level"], grader=grader)
    if rows["subject"].notna().any():
        tables["by_subject"] = accuracy(rows[rows["subject"].notna()], group + ["subject"], grader=grader)
    records = []
    for model, part in rows.groupby("model", sort=False):
        conds = conditions_in_order(part)
        base = baseline if baseline is not None else conds[0]
        if base not in conds:
            raise LensprobeError(f"baseline condition {base!r} is not in the results ({conds}).")
        for other in conds:
            if other == base:
                continue
            for g in graders:
                if part[g].notna().any():
                    records.append({"model": model, **compare(part, base, other, grader=g).to_dict()})
    tables["comparisons"] = pd.DataFrame.from_records(records)
    return tables


def avg_at_k(df, k: int, by: str | list[str] = "condition", *, grader: str | None = None):
    """avg@k: the accuracy of each of ``k`` runs (samples ``0 .. k-1`` of every problem), averaged,
    as the paper's Table 1 averages five runs.

    Args:
        df: result rows with ``problem_id``, ``sample`` and the verdict column; every problem
            needs samples ``0 .. k-1`` with a verdict.
        k: runs to average (samples ``0 .. k-1``; more samples are left out).
        by: column(s) to group by.
        grader: verdict column (``None``: the table's default).

    Returns:
        A DataFrame with the group columns and ``k``, ``problems``, ``avg@{k}`` (mean of the
        runs' accuracies), ``min``, ``max`` (the lowest and highest run), ``grader``.

    Raises:
        LensprobeError: a problem lacks one of the samples ``0 .. k-1`` or its verdict.

    Example:
        >>> avg_at_k(rows, k=5, by="condition", grader="paper-exact")   # Table 1's average of 5 runs
    """
    pd = pandas()
    k = _check_k(k)
    grader = resolve_grader(df, grader)
    check_verdict_column(df, grader)  # 'False', 0, 0.5 are refused, never counted
    by = [by] if isinstance(by, str) else list(by)
    missing = [c for c in by + ["problem_id", "sample"] if c not in df.columns]
    if missing:
        raise LensprobeError(f"avg@k needs columns {missing}: the table has columns {list(df.columns)}.")
    runs = df[df["sample"].isin(range(k))]
    records = []
    for key, group in df.groupby(by, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        part = runs.loc[runs.index.intersection(group.index)]
        problems = group["problem_id"].nunique()
        have = part[part[grader].notna()]
        if len(have) != problems * k or have.groupby("problem_id")["sample"].nunique().min() != k:
            raise LensprobeError(
                f"avg@{k} needs samples 0-{k - 1} of every problem with a {grader!r} verdict: "
                f"{', '.join(f'{c}={_plain(v)!r}' for c, v in zip(by, key, strict=True))} has {len(have)} of "
                f"{problems * k}. Run n_samples >= {k} (with do_sample) or lower k."
            )
        per_run = have.groupby("sample")[grader].apply(lambda v: float(v.astype(bool).mean()))
        records.append({**dict(zip(by, key, strict=True)), "k": k, "problems": problems,
                        f"avg@{k}": float(per_run.mean()), "min": float(per_run.min()),
                        "max": float(per_run.max()), "grader": grader})
    return pd.DataFrame.from_records(records, columns=by + ["k", "problems", f"avg@{k}", "min", "max", "grader"])
