"""Which verdict column a table counts: the graders' columns, the authors' ``paper-exact``, and the
default per result folder (``paper-exact`` for folders evaluated in the authors' format).

Every result row holds one boolean column per grader of :data:`~lensprobe.evals.grading.grade.GRADERS`
(on the extracted answer) and :data:`PAPER_EXACT`, the meaningless-tokens authors' own verdict
(``is_equiv`` on prompt + generation, :func:`~lensprobe.evals.grading.grade.grade_paper_exact`). The
statistics (:func:`~lensprobe.evals.results.stats.accuracy`, pass@k, :func:`~lensprobe.evals.results.stats.compare`)
take any of them, or any other column of booleans a user adds (their own grader).

A folder evaluated with ``prompt_format="paper"`` (or one of the authors' protocols) reports
``paper-exact`` by default, the metric of the paper's tables, with ``math-verify`` beside it;
other folders report ``math-verify``. Result tables carry that default in
``DataFrame.attrs["default_grader"]`` (:func:`mark_default_grader`), so ``accuracy(rows)``
counts the right column without being told.
"""

from lensprobe.core.errors import LensprobeError
from lensprobe.evals.grading.grade import GRADERS

__all__ = ["PAPER_EXACT", "VERDICT_COLUMNS", "default_grader", "mark_default_grader", "resolve_grader",
           "verdict_columns"]

PAPER_EXACT = "paper-exact"
"""The column of the authors' verdict (their ``is_equiv`` on prompt + generation)."""

VERDICT_COLUMNS = (*GRADERS, PAPER_EXACT)
"""Every verdict column lensprobe writes: ``math-verify``, ``paper``, ``paper-lenient``, ``paper-exact``."""

_ATTR = "default_grader"


def default_grader(config: dict | None) -> str:
    """The verdict column a result folder reports by default, from its ``config.json``.

    ``paper-exact`` when the folder was evaluated in the authors' prompt format (or under one of
    their protocols), else ``math-verify``.

    Example:
        >>> default_grader({"settings": {"generation": {"prompt_format": "paper"}}})
        'paper-exact'
        >>> default_grader({"settings": {"generation": {}}})
        'math-verify'
    """
    generation = ((config or {}).get("settings") or {}).get("generation") or {}
    paper = generation.get("prompt_format") == "paper" or bool(generation.get("protocol"))
    return PAPER_EXACT if paper else "math-verify"


def mark_default_grader(df, grader: str):
    """``df`` with ``grader`` recorded as its default verdict column (``df.attrs``); returns ``df``."""
    df.attrs[_ATTR] = grader
    return df


def verdict_columns(df) -> list[str]:
    """The verdict columns of ``df`` that hold at least one verdict, lensprobe's order first, then
    the columns of booleans a user added."""
    ours = [c for c in VERDICT_COLUMNS if c in df.columns and df[c].notna().any()]
    return ours + [c for c in df.columns if c not in VERDICT_COLUMNS and _is_verdict(df[c])]


def _is_verdict(values) -> bool:
    present = values[values.notna()]
    return len(present) > 0 and all(isinstance(v, bool) or type(v).__name__ == "bool_" for v in present)


def resolve_grader(df, grader: str | None) -> str:
    """The verdict column to count: ``grader`` when given, else the table's default
    (:func:`mark_default_grader`, ``math-verify`` when unmarked). Checks that ``df`` has it.

    Raises:
        LensprobeError: the column is missing, or holds something other than verdicts.

    Example:
        >>> resolve_grader(rows, None)          # rows of a paper-format folder
        'paper-exact'
    """
    if grader is None:
        grader = df.attrs.get(_ATTR, "math-verify")
    if not isinstance(grader, str):
        raise LensprobeError(f"grader must be a column name such as {VERDICT_COLUMNS}, got {grader!r}.")
    if grader not in df.columns:
        known = [c for c in VERDICT_COLUMNS if c in df.columns]
        what = "the result table has no" if grader in VERDICT_COLUMNS else "unknown grader: the result table has no"
        raise LensprobeError(f"{what} {grader!r} column: use one of {known} (or a column of booleans you added).")
    if grader not in VERDICT_COLUMNS and not _is_verdict(df[grader]):
        raise LensprobeError(
            f"column {grader!r} does not hold verdicts (True/False, or None for no verdict): use one of "
            f"{[c for c in VERDICT_COLUMNS if c in df.columns]}."
        )
    return grader
