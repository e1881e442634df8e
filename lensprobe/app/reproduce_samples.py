"""Numbers over each problem's samples for table recipes: pass@k with its interval (Figure 6's pass@3) and the
Best-of-N rows (Table 8), used by :func:`lensprobe.app.reproduce.reproduce`.

**pass@k** (a protocol with ``k``, e.g. ``arm-aime-pass3``): the unbiased estimate ``1 - C(n-c, k) / C(n, k)`` per
problem (:func:`~lensprobe.evals.results.stats.pass_at_k`, the authors' formula), averaged over problems, with a 95% interval
``mean +- 1.96 x`` the standard error over problems (normal approximation, clipped to 0-100).

Under a protocol that draws several samples per problem, the accuracy's 95% interval is the same over problems
(pass@1's), as a problem's samples are not independent.

**Best-of-N** (a recipe with ``best_of = "majority"``): the paper (Table 8) does not say how the best of the N samples
is chosen. lensprobe takes the **majority answer**: among a problem's N samples (the protocol's ``n_samples``), the
extracted answer (``prediction``, the last ``\\boxed{}`` of the generated text) given most often, ties to the one
sampled first; the problem counts as solved when that sample's verdict is correct. Oracle selection (solved when any
of the N is correct, pass@N) cannot be the paper's reading: Table 8's AIME Best-of-N equals its pass@1 baseline
(14.4 and 23.3), which an oracle over five samples would exceed.
"""

import math

from lensprobe.core.lazy import pandas
from lensprobe.evals.results.stats import pass_at_k
from lensprobe.evals.running.protocols import get_protocol

__all__ = ["GRADER", "best_of_name", "best_of_rows", "pass_columns", "pass_numbers", "sample_columns", "sample_rows"]

GRADER = "paper-exact"
"""The verdict column these numbers count (the authors' ``is_equiv``)."""


def pass_columns(k: int) -> tuple[str, str, str]:
    """The run's pass@k columns: the estimate and its 95% interval (percent)."""
    return f"run: pass@{k} (authors' grader)", f"run: pass@{k} 95% CI low", f"run: pass@{k} 95% CI high"


def sample_columns(recipe) -> tuple[str, ...]:
    """The run's columns a recipe adds to :data:`~lensprobe.app.reproduce_tables.RUN_COLUMNS` (pass@k's)."""
    k = get_protocol(recipe.protocol).k if recipe.protocol else None
    return pass_columns(k) if k else ()


def pass_numbers(rows, name: str, k: int) -> dict:
    """pass@k of condition ``name`` over its problems (rows without a verdict left out), with its interval.

    Example:
        >>> pass_numbers(rows, "w/o", 3)["run: pass@3 (authors' grader)"]
    """
    mine = rows[(rows["condition"] == name) & rows[GRADER].notna()]
    values = [pass_at_k(len(g), int(g[GRADER].astype(bool).sum()), k)
              for _, g in mine.groupby("problem_id", sort=False) if len(g) >= k]
    cols = pass_columns(k)
    if not values:
        return dict.fromkeys(cols)
    mean = sum(values) / len(values)
    half = 1.96 * _sd(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    low, high = (max(0.0, mean - half), min(1.0, mean + half)) if half == half else (None, None)
    return {cols[0]: round(100 * mean, 1), cols[1]: None if low is None else round(100 * low, 1),
            cols[2]: None if high is None else round(100 * high, 1)}


def _sd(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def best_of_name(condition: str, n: int) -> str:
    """The Best-of-N row of ``condition``: ``"Best-of-N (N=5)"`` for ``w/o``, ``"Best-of-N (N=5)+ARM"`` for ``ARM``
    (Table 8's row names)."""
    return f"Best-of-N (N={n})" + ("" if condition == "w/o" else f"+{condition}")


def best_of_rows(rows, name: str, new_name: str):
    """One row per problem of condition ``name``: the majority answer's first sample (see the module docs),
    renamed ``new_name``. Rows without a verdict are left out before the vote."""
    pd = pandas()
    mine = rows[(rows["condition"] == name) & rows[GRADER].notna()]
    picked = []
    for _, group in mine.groupby("problem_id", sort=False):
        group = group.sort_values("sample", kind="stable")
        keys = [str(p).strip() if p is not None and p == p else "" for p in group["prediction"]]
        counts = {key: keys.count(key) for key in keys}
        winner = next(key for key in keys if counts[key] == max(counts.values()))
        picked.append(group.iloc[keys.index(winner)])
    out = pd.DataFrame(picked, columns=rows.columns)
    out["condition"] = new_name
    return out.reset_index(drop=True)


def sample_rows(recipe, name: str, runs: list) -> list[tuple[str, list, dict]]:
    """``(row name, runs' rows, extra numbers)`` of the table rows condition ``name`` gives: itself (with pass@k when
    the protocol has ``k``), then its Best-of-N row when the recipe has ``best_of``."""
    protocol = get_protocol(recipe.protocol) if recipe.protocol else None
    extra = pass_numbers(runs[0], name, protocol.k) if protocol and protocol.k and runs else {}
    if protocol and protocol.settings.get("n_samples", 1) > 1 and len(runs) == 1:
        # a problem's samples are not independent: the accuracy's interval over problems (pass@1's), not over rows
        one = pass_numbers(runs[0], name, 1)
        extra = {**extra, "run: 95% CI low": one[pass_columns(1)[1]], "run: 95% CI high": one[pass_columns(1)[2]]}
    out = [(name, runs, extra)]
    if recipe.best_of and runs:
        n = int((protocol.settings if protocol else {}).get("n_samples", 1))
        new = best_of_name(name, n)
        out.append((new, [best_of_rows(r, name, new) for r in runs], {}))
    return out
