"""Reading problem files: JSONL (one object per line), a JSON list of objects, or Parquet, into
``(line number or row index, row)`` pairs; :mod:`lensprobe.evals.problems.load` turns the rows into problems.

Example:
    >>> rows, unit = read_rows(Path("math500.jsonl"), format_of(Path("math500.jsonl"), None))
"""

import io
import json
from pathlib import Path

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import heavy
from lensprobe.core.storage.files import DATA_LIMIT, check_file, read_text
from lensprobe.core.storage.nesting import parse_json

__all__ = ["FORMATS", "check_problem_file", "format_of", "jsonl_rows", "read_rows"]

FORMATS = ("jsonl", "parquet")
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet"}


def _problem_text(path: Path) -> str:
    return read_text(path, "problem file", DATA_LIMIT)


def jsonl_rows(path: Path, text: str | None = None) -> list[tuple[int, object]]:
    """``(line number, parsed value)`` for every non-blank line of a JSONL file (``text``: its text,
    when already read)."""
    rows: list[tuple[int, object]] = []
    lines = io.StringIO(_problem_text(path) if text is None else text, newline=None)  # lines as a file has them
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append((line_no, parse_json(line, f"{path} line {line_no}")))
        except json.JSONDecodeError as err:
            raise LensprobeError(
                f"{path} line {line_no} is not valid JSON ({err.msg} at column {err.colno}): "
                "fix or remove that line; the file must hold one JSON object per line."
            ) from None
        except LensprobeError as err:
            raise LensprobeError(f"{path} line {line_no}: {err}") from None
    return rows


def _json_array_rows(path: Path, text: str) -> list[tuple[int, object]]:
    try:
        data = parse_json(text, f"problem file {path}")
    except json.JSONDecodeError as err:
        raise LensprobeError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}): fix the file, "
                             "or write one JSON object per line (JSONL).") from None
    except LensprobeError as err:
        raise LensprobeError(f"{path}: {err}") from None
    if not isinstance(data, list):
        raise LensprobeError(f"{path} holds a JSON {type(data).__name__}, not a list of rows: write one "
                             "JSON object per line (JSONL), or a JSON list of objects.")
    return list(enumerate(data))


def _parquet_rows(path: Path) -> list[tuple[int, object]]:
    try:
        pq = heavy("pyarrow.parquet")
    except ImportError:
        pq = None
    if pq is not None:
        try:
            table = pq.read_table(path)
        except Exception as err:  # pyarrow's own errors: not Parquet, damaged file
            raise LensprobeError(f"{path} could not be read as Parquet ({type(err).__name__}: {err}): "
                                 "check the file, or pass file_format='jsonl' if it is JSONL.") from err
        return list(enumerate(table.to_pylist()))
    try:
        frame = heavy("pandas").read_parquet(path)
    except ImportError as err:
        raise LensprobeError("reading Parquet needs the 'pyarrow' package (pip install pyarrow); "
                             "or convert the file to JSONL.") from err
    return list(enumerate(frame.to_dict(orient="records")))


def format_of(path: Path, requested: str | None) -> str:
    """The format of ``path``: ``requested`` when given (checked), else read from the suffix."""
    if requested is not None:
        if requested not in FORMATS:
            raise LensprobeError(f"file_format must be one of {FORMATS} or None, got {requested!r}.")
        return requested
    found = _SUFFIXES.get(path.suffix.lower())
    if found is None:
        raise LensprobeError(f"cannot tell the format of {path} from its suffix {path.suffix!r}: name it .jsonl "
                             "or .parquet, or pass file_format='jsonl' or file_format='parquet'.")
    return found


def check_problem_file(path: Path) -> None:
    """A problem file must be a regular file (a folder or ``/dev/null`` is named as what it is)."""
    if path.is_dir():
        raise LensprobeError(f"problem file {path} is a folder: pass a .jsonl, .json or .parquet file.")
    if path.exists() and not path.is_file():
        raise LensprobeError(f"problem file {path} is not a regular file (a device or a pipe): pass a .jsonl file.")
    if not path.exists():
        raise LensprobeError(f"problem file not found: {path}. Check the path.")


def read_rows(path: Path, fmt: str) -> tuple[list[tuple[int, object]], str]:
    """The file's rows as ``(line number or row index, row)``, and the unit that number counts."""
    check_problem_file(path)
    if fmt == "parquet":
        check_file(path, "problem file", DATA_LIMIT)
        return _parquet_rows(path), "row"
    text = _problem_text(path)
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        return _json_array_rows(path, text), "row"
    return jsonl_rows(path, text), "line"
