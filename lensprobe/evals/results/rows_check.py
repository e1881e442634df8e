"""Checks on result rows as they are read back: every field has its type, verdicts are verdicts.

A results file is plain JSONL that people open and edit. Rows read back are checked before
anything counts them (:func:`check_row`, called by :func:`lensprobe.evals.results.folder.read_rows`,
so by resumes, :func:`~lensprobe.evals.results.folder.load_results` and ``eval-report``), and verdict
columns of a table are checked before :func:`~lensprobe.evals.results.stats.accuracy` or
:func:`~lensprobe.evals.results.stats.compare` count them (:func:`check_verdict_column`):

- a verdict is ``true``, ``false`` or ``null`` (no verdict); ``"false"``, ``0``, ``-1`` or
  ``0.5`` are refused, since Python would count them as right or wrong by accident;
- a ``NaN`` verdict is a missing verdict: the row becomes an error row (left out of every
  count, named in the summary, generated again by a resumed run);
- ``condition`` and ``problem_id`` are strings and ``sample`` a whole number >= 0;
- a row records the identity of the run that wrote it (``config_hash``, ``condition_hash``); a
  row whose identity is not its folder's ``config.json``'s is refused (:func:`check_row_identity`);
- two finished rows of one (condition, problem, sample) whose verdicts differ
  (:func:`same_verdicts`) are refused, both lines named, by the results store's one merge rule
  (:func:`~lensprobe.core.storage.store.merge_rows`).
"""

import math
from pathlib import Path
from typing import Any

import numpy as np

from lensprobe.core.errors import LensprobeError
from lensprobe.evals.grading.grade import GRADERS

__all__ = ["ROW_FIX", "VERDICT_COLUMNS", "check_row", "check_row_identity", "check_verdict_column", "is_verdict",
           "same_verdicts"]

VERDICT_COLUMNS = tuple(dict.fromkeys((*GRADERS, "paper-exact")))
"""Columns of a result row that hold a verdict (``true``/``false``/``null``)."""

ROW_FIX = ("fix it (verdicts are true, false or null; sample is a whole number >= 0; condition and problem_id are "
           "strings) or delete that line to run the row again")
"""What to do about a row that is refused (the end of every message here)."""

_REQUIRED = {"condition": str, "problem_id": str}
_OPTIONAL_TEXT = ("finish", "prediction", "answer", "model", "error", "subject")
_NO_ANSWER = ("error", "nonfinite")  # finish values of rows without an answer: their verdicts are null


def _is_nan(value: Any) -> bool:
    """``NaN`` (a missing value in a float or pandas column)."""
    return (isinstance(value, float) and math.isnan(value)) or type(value).__name__ == "NAType"


def is_verdict(value: Any) -> bool:
    """Whether ``value`` is a verdict: ``True``, ``False`` (numpy booleans too) or ``None``.

    Example:
        >>> is_verdict(False), is_verdict("false"), is_verdict(0), is_verdict(None)
        (True, False, False, True)
    """
    return value is None or isinstance(value, (bool, np.bool_))


def check_row(row: Any, path: str | Path, line_no: int) -> dict:
    """A result row read from ``path`` line ``line_no``, checked (a ``NaN`` verdict makes it an error row).

    Args:
        row: the line's JSON value.
        path: the results file (for messages).
        line_no: the 1-based line number (for messages).

    Returns:
        The row; when a verdict is ``NaN``, a copy with ``finish="error"``, every verdict
        ``None`` and the reason in ``error``.

    Raises:
        LensprobeError: the value is not a row (not an object, or without ``condition``,
            ``problem_id`` or ``sample``), or a field has the wrong type; the message names
            the file, the line and the fix.

    Example:
        >>> check_row({"condition": "w/o", "problem_id": "q1", "sample": 0, "math-verify": True}, Path("r.jsonl"), 1)
        {'condition': 'w/o', 'problem_id': 'q1', 'sample': 0, 'math-verify': True}
    """
    where = f"{path} line {line_no}"
    if not isinstance(row, dict):
        raise LensprobeError(f"{where} is not a result row: it holds {_kind(row)}, not a JSON object with condition, "
                             f"problem_id and sample: {ROW_FIX}.")
    missing = [k for k in (*_REQUIRED, "sample") if k not in row]
    if missing:
        raise LensprobeError(f"{where} is not a result row: it has no {', '.join(repr(k) for k in missing)} field "
                             f"(fields: {sorted(row)[:8]}): {ROW_FIX}.")
    for key, kind in _REQUIRED.items():
        if not isinstance(row[key], kind):
            raise _wrong(where, key, row[key], "a string")
    sample = row["sample"]
    if not isinstance(sample, int) or isinstance(sample, bool) or sample < 0:
        raise _wrong(where, "sample", sample, "a whole number >= 0")
    for key in _OPTIONAL_TEXT:
        if row.get(key) is not None and not isinstance(row[key], str):
            raise _wrong(where, key, row[key], "a string or null")
    nan = [k for k in VERDICT_COLUMNS if _is_nan(row.get(k))]
    for key in VERDICT_COLUMNS:
        if key in row and not _is_nan(row[key]) and not is_verdict(row[key]):
            raise _wrong(where, key, row[key], "true, false or null")
    if nan:
        return {**row, **dict.fromkeys(VERDICT_COLUMNS), "finish": "error",
                "error": f"its {nan[0]!r} verdict was NaN ({where}): graded again when the run is resumed"}
    if row.get("finish") in _NO_ANSWER and any(row.get(k) is not None for k in VERDICT_COLUMNS):
        key = next(k for k in VERDICT_COLUMNS if row.get(k) is not None)
        raise LensprobeError(f"{where} has finish {row['finish']!r} (no answer) but a {key!r} verdict "
                             f"{row[key]!r}: {ROW_FIX}.")
    return row


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    name = {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return f"{name.get(type(value), type(value).__name__)} ({str(value)[:40]})"


def _wrong(where: str, key: str, value: Any, want: str) -> LensprobeError:
    return LensprobeError(f"{where}: {key!r} is {value!r} ({type(value).__name__}), which is not {want}: {ROW_FIX}.")


def check_row_identity(row: dict, config: dict, path: str | Path, line_no: int) -> None:
    """Refuse a row whose recorded identity is not its folder's: its ``config_hash`` must be the
    ``config_hash`` of the folder's ``config.json``, and its ``condition_hash`` the hash that
    ``config.json`` records for its condition. The hashes are compared as recorded, never
    computed again.

    Raises:
        LensprobeError: names the rows' file and line, both identities and what to do.

    Example:
        >>> check_row_identity({"condition": "w/o", "config_hash": "a1", "condition_hash": "c1"},
        ...                    {"hash": "a1", "parts": {"w/o": {"hash": "c1"}}}, Path("r.jsonl"), 1)
    """
    fix = (f"rows of another run are neither counted nor resumed: move {Path(path).name} to the folder of the run "
           "that wrote it, or delete it (or the line) to run its rows again.")
    got, want = row.get("config_hash"), config.get("hash")
    if got != want:
        raise LensprobeError(f"{path} line {line_no} records config_hash {got!r}, but the folder's config.json has "
                             f"{want!r}: {fix}")
    described = config.get("parts", {}).get(row["condition"])
    want = described.get("hash") if isinstance(described, dict) else None
    if row.get("condition_hash") != want:
        has = f"records {want!r} for it" if described is not None else "does not describe it"
        raise LensprobeError(f"{path} line {line_no} records condition {row['condition']!r} with condition_hash "
                             f"{row.get('condition_hash')!r}, but the folder's config.json {has}: {fix}")


def same_verdicts(a: dict, b: dict) -> bool:
    """Whether two rows of one (condition, problem, sample) give every verdict alike (what is counted).

    Example:
        >>> same_verdicts({"math-verify": True}, {"math-verify": True, "seconds": 2.0})
        True
    """
    return all(a.get(k) == b.get(k) for k in VERDICT_COLUMNS)


def check_verdict_column(df, grader: str) -> None:
    """Refuse a table whose ``grader`` column holds anything but ``True``, ``False`` or no verdict
    (``None``/``NaN``), before it is counted.

    Raises:
        LensprobeError: names the first bad value and its row.

    Example:
        >>> check_verdict_column(pd.DataFrame({"paper": [True, None]}), "paper")
    """
    values = df[grader]
    if values.dtype == bool:
        return
    for index, value in values.items():
        if not (is_verdict(value) or _is_nan(value)):
            raise LensprobeError(
                f"the {grader!r} column holds {value!r} ({type(value).__name__}) at row {index!r}: verdicts must be "
                "True, False or None (no verdict); convert the column, e.g. rows[grader].map({'true': True, "
                "'false': False}), or reload the folder with lp.evals.load_results.")
