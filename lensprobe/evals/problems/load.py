"""Evaluation problems: MATH-500 (shipped, local or from the hub) and any problem/answer JSONL or Parquet file.

A problem set is a list of :class:`Problem`.

- :func:`load_math500` reads, with no path, the MATH-500 copy lensprobe ships
  (:func:`math500_path`), offline; a local JSONL file with one JSON object per line holding at
  least ``problem`` and ``answer`` (MATH-500's own file, or your own set: GSM8K-style rows work
  too, see below); or ``"hub"``: the hub dataset ``HuggingFaceH4/MATH-500`` through ``datasets``.
- :func:`load_problems` reads any JSONL or Parquet file whose rows hold a problem and an answer,
  under configurable field names (``question``/``Answer`` and other common names are found
  automatically), e.g. the AIME 2024 and 2025 sets.

Optional fields: ``subject`` and ``level`` (used for per-subject and per-level accuracy)
and ``unique_id`` or ``id`` (the problem's id in result files; otherwise ``"line-N"`` in
:func:`load_math500`, ``"<file stem>-<row index>"`` in :func:`load_problems`).
"""

import logging
import math
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import heavy
from lensprobe.core.prompts.text import blank, check_text
from lensprobe.core.storage.files import DATA_LIMIT, check_file
from lensprobe.evals.problems.files import check_problem_file, format_of, jsonl_rows, read_rows
from lensprobe.evals.problems.hub import load_hub_dataset

HUB_DATASET = "HuggingFaceH4/MATH-500"


@dataclass(frozen=True)
class Problem:
    """One evaluation problem.

    Attributes:
        id: stable id used to match result rows (``unique_id``/``id`` field, or ``line-N``).
        problem: the question text given to the model.
        answer: the reference answer (LaTeX for MATH).
        subject: e.g. ``"Algebra"``, or ``None``.
        level: difficulty 1-5 for MATH, or ``None``.
    """

    id: str
    problem: str
    answer: str
    subject: str | None = None
    level: int | None = None


PACKAGED_MATH500 = Path(__file__).resolve().parents[1] / "math500" / "test.jsonl"
"""MATH-500 as shipped with lensprobe (MIT License; source in ``math500/README.md`` beside it)."""


def math500_path() -> Path:
    """The MATH-500 file lensprobe reads: ``$LENSPROBE_MATH500`` when set, else the copy it ships.

    Raises:
        LensprobeError: ``$LENSPROBE_MATH500`` names no file, or the shipped copy is missing
            (a broken installation: reinstall lensprobe).

    Example:
        >>> lp.evals.math500_path().name
        'test.jsonl'
    """
    env = os.environ.get("LENSPROBE_MATH500")
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise LensprobeError(f"LENSPROBE_MATH500={env!r} is not a file: point it at a MATH-500 JSONL file, "
                                 "or unset it to use the copy lensprobe ships.")
        check_file(path, "MATH-500 file (LENSPROBE_MATH500)", DATA_LIMIT)
        return path
    if not PACKAGED_MATH500.is_file():
        raise LensprobeError(f"lensprobe's copy of MATH-500 is missing ({PACKAGED_MATH500}): reinstall lensprobe, "
                             "or set LENSPROBE_MATH500 to a MATH-500 JSONL file.")
    return PACKAGED_MATH500


def _gsm8k_answer(answer: str) -> str:
    # GSM8K's reference holds the worked solution, then "#### <number>": keep the number.
    if "####" in answer:
        return answer.rsplit("####", 1)[1].strip().replace(",", "")
    return answer


@dataclass(frozen=True)
class _Fields:
    """Which row fields hold a problem's parts (``None``: the part is absent)."""

    problem: str = "problem"
    answer: str = "answer"
    id: str | None = None  # None: "unique_id" or "id" when the row has one, else the default id
    subject: str | None = "subject"
    level: str | None = "level"


_MATH500_FIELDS = _Fields()

PROBLEM_FIELDS = ("problem", "question", "Problem", "Question")
"""Fields :func:`load_problems` reads the problem from, in this order, when ``problem_field`` is left
at ``"problem"`` and the file has no ``problem`` field."""

ANSWER_FIELDS = ("answer", "Answer", "final_answer", "expected_answer")
"""Fields :func:`load_problems` reads the answer from, in this order, when ``answer_field`` is left
at ``"answer"`` and the file has no ``answer`` field."""

FileFormat = Literal["jsonl", "parquet"]

logger = logging.getLogger(__name__)


def _is_missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _problem_from_row(row, where: str, line_no: int, fields: _Fields = _MATH500_FIELDS,
                      default_id: str | None = None, unit: str = "line") -> Problem:
    loc = f"{where} {unit} {line_no}"
    if not isinstance(row, dict):
        raise LensprobeError(f"{loc}: expected a JSON object, got {type(row).__name__}.")
    for key in (fields.problem, fields.answer):
        if key not in row or _is_missing(row[key]):
            has = f"its {key!r} is {row[key]!r}" if key in row else f"the row has no {key!r} field"
            raise LensprobeError(
                f"{loc}: {has} (fields: {sorted(row)}). "
                f"Every row needs {fields.problem!r} and {fields.answer!r}; rename your fields or fix the row."
            )
    problem, answer = row[fields.problem], row[fields.answer]
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(problem, str) or blank(problem):
        raise LensprobeError(f"{loc}: {fields.problem!r} must be a non-empty string (not only spaces or invisible "
                             "characters such as U+200B).")
    if not isinstance(answer, str) or blank(answer):
        raise LensprobeError(f"{loc}: {fields.answer!r} must be a non-empty string or number.")
    for key, value in ((fields.problem, problem), (fields.answer, answer)):
        check_text(value, f"{loc}: {key!r}")  # a lone surrogate would fail only when its row is written
    level = row.get(fields.level) if fields.level is not None else None
    if _is_missing(level):
        level = None
    if isinstance(level, str):  # "Level 3" in the original MATH files
        digits = "".join(ch for ch in level if ch.isdigit())
        level = int(digits) if digits else None
    if isinstance(level, float) and level.is_integer():  # an integer column with gaps, read as floats
        level = int(level)
    if level is not None and (not isinstance(level, int) or isinstance(level, bool)):
        raise LensprobeError(f"{loc}: {fields.level!r} must be an integer, got {level!r}.")
    subject = row.get(fields.subject) if fields.subject is not None else None
    if fields.id is None:
        pid = row.get("unique_id", row.get("id"))
    else:
        pid = row.get(fields.id)
        if _is_missing(pid):
            raise LensprobeError(f"{loc}: the row has no {fields.id!r} value, which id_field names: "
                                 "fill it in, or pass id_field=None for default ids.")
    if _is_missing(pid):
        pid = None
    return Problem(
        id=str(pid) if pid is not None else (default_id or f"line-{line_no}"),
        problem=problem,
        answer=_gsm8k_answer(answer.strip()),
        subject=None if _is_missing(subject) else subject,
        level=level,
    )


def read_jsonl_problems(path: str | os.PathLike) -> list[Problem]:
    """Read every problem of a JSONL file (blank lines are skipped).

    Rows need ``problem`` and ``answer``; ids come from ``unique_id`` or ``id``, else ``"line-N"``.

    Raises:
        LensprobeError: the file is missing, a line is not valid JSON (the message gives
            its line number), a row lacks ``problem`` or ``answer``, or two rows share an id.

    Example:
        >>> read_jsonl_problems(math500_path())[0].id
        'test/precalculus/807.json'
    """
    path = Path(path).expanduser()
    check_problem_file(path)
    problems = [_problem_from_row(row, str(path), line_no) for line_no, row in jsonl_rows(path)]
    if not problems:
        raise LensprobeError(f"{path} holds no problems: expected one JSON object per line.")
    _check_unique_ids(problems, str(path))
    return problems


def _check_unique_ids(problems: list[Problem], where: str) -> None:
    seen: set[str] = set()
    for p in problems:
        if p.id in seen:
            raise LensprobeError(
                f"{where}: two rows share the id {p.id!r}; ids ('unique_id' or 'id', or the id_field column) "
                "must be unique because results are matched by id."
            )
        seen.add(p.id)


def _hub_problems() -> list[Problem]:
    try:
        heavy("datasets")
    except ImportError as err:
        raise LensprobeError(
            "loading MATH-500 from the hub needs the 'datasets' package (pip install datasets); "
            "or pass a local JSONL file: load_math500('path/to/test.jsonl')."
        ) from err
    ds = load_hub_dataset(HUB_DATASET, "test", fix=(
        f"Download it on a machine with network access (datasets.load_dataset({HUB_DATASET!r}, split='test')"
        ".to_json('math500.jsonl')) and pass the local file: --data math500.jsonl on the command line, or "
        "load_math500('math500.jsonl')."))
    problems = [_problem_from_row(dict(row), HUB_DATASET, i + 1) for i, row in enumerate(ds)]
    _check_unique_ids(problems, HUB_DATASET)
    return problems


def _as_list(value, name: str) -> list | None:
    if value is None:
        return None
    if isinstance(value, (str, int)):
        return [value]
    if isinstance(value, Iterable):
        return list(value)
    raise LensprobeError(f"{name} must be a value or a list of values, got {value!r}.")


def _select(problems: list[Problem], where: str, subjects, levels, limit, seed) -> list[Problem]:
    """Filter by subject and level, shuffle with ``seed``, cut to ``limit``."""
    subject_list = _as_list(subjects, "subjects")
    if subject_list is not None:
        known = sorted({p.subject for p in problems if p.subject is not None})
        unknown = [s for s in subject_list if s not in known]
        if unknown:
            raise LensprobeError(f"unknown subject(s) {unknown} in {where}: choose from {known}.")
        problems = [p for p in problems if p.subject in subject_list]
    level_list = _as_list(levels, "levels")
    if level_list is not None:
        bad = [lv for lv in level_list if not isinstance(lv, int) or isinstance(lv, bool)]
        if bad:
            raise LensprobeError(f"levels must be integers (e.g. 1-5 for MATH), got {bad}.")
        known_levels = sorted({p.level for p in problems if p.level is not None})
        if not known_levels:
            raise LensprobeError(f"{where} has no 'level' field: drop the levels filter.")
        unknown = [lv for lv in level_list if lv not in known_levels]
        if unknown:
            raise LensprobeError(f"unknown level(s) {unknown} in {where}: choose from {known_levels}.")
        problems = [p for p in problems if p.level in level_list]
    if seed is not None:
        problems = list(problems)
        random.Random(seed).shuffle(problems)
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
            raise LensprobeError(f"limit must be a positive integer, got {limit!r}.")
        problems = problems[:limit]
    if not problems:
        raise LensprobeError(f"no problems left in {where} after filtering: loosen subjects/levels.")
    return problems


def load_math500(path: str | os.PathLike | None = None, *, subjects: str | list[str] | None = None,
                 levels: int | list[int] | None = None, limit: int | None = None,
                 seed: int | None = None) -> list[Problem]:
    """Load MATH-500 (or any problem/answer JSONL), optionally filtered, shuffled and cut.

    For other sets (AIME, Parquet files, other field names) use :func:`load_problems`; on a
    file with ``problem``, ``answer`` and ``unique_id``/``id`` fields both return the same
    problems.

    Args:
        path: ``None`` for the MATH-500 copy lensprobe ships (:func:`math500_path`); a local
            JSONL file; or ``"hub"`` to load ``HuggingFaceH4/MATH-500`` from the Hugging Face hub
            with ``datasets`` (offline this fails with a message saying to pass a path). Any JSONL
            with ``problem`` and ``answer`` fields works; an answer holding ``"#### N"``
            (GSM8K's format) is cut to ``N``. Rows without ``unique_id`` or ``id`` get the id
            ``"line-N"`` (N: the line number).
        subjects: keep only these subjects (e.g. ``"Algebra"``); names must exist in the file.
        levels: keep only these levels (1-5 for MATH).
        limit: keep at most this many problems (after filtering and shuffling).
        seed: shuffle with this seed before ``limit``; ``None`` keeps file order.

    Returns:
        A list of :class:`Problem`.

    Example:
        >>> probs = load_math500(levels=1, limit=20)
        >>> probs[0].answer
        '\\\\sqrt{51}'
    """
    hub = isinstance(path, str) and path in ("hub", HUB_DATASET)
    if path is None:
        path = math500_path()
    problems = _hub_problems() if hub else read_jsonl_problems(path)
    return _select(problems, HUB_DATASET if hub else str(path), subjects, levels, limit, seed)


def _pick_field(columns: list[str], requested: str, default: str, alternatives: tuple[str, ...],
                argument: str, path: Path) -> str:
    """The column that holds one part: ``requested`` when present; when ``requested`` is the default
    and absent, the first of ``alternatives`` present; else an error listing the columns."""
    if not isinstance(requested, str) or not requested:
        raise LensprobeError(f"{argument} must be a column name (a non-empty string), got {requested!r}.")
    if requested in columns:
        return requested
    if requested == default:
        for name in alternatives:
            if name in columns:
                logger.info("%s: no %r field; reading %r (pass %s= to choose another column).",
                            path.name, default, name, argument)
                return name
        looked = f"{requested!r} (or {', '.join(repr(a) for a in alternatives if a != requested)})"
    else:
        looked = repr(requested)
    raise LensprobeError(f"{path}: no field {looked} in the rows; the file's columns are {columns}. "
                         f"Pass {argument}='<column>' naming the column that holds it.")


def _optional_field(columns: list[str], requested: str | None, default: str, argument: str,
                    path: Path) -> str | None:
    if requested is None or (requested == default and requested not in columns):
        return None
    return _pick_field(columns, requested, default, (), argument, path)


def load_problems(path: str | os.PathLike, *, problem_field: str = "problem", answer_field: str = "answer",
                  id_field: str | None = None, subject_field: str | None = "subject",
                  level_field: str | None = "level", file_format: FileFormat | None = None,
                  keep: Callable[[dict], bool] | None = None, subjects: str | list[str] | None = None,
                  levels: int | list[int] | None = None, limit: int | None = None,
                  seed: int | None = None) -> list[Problem]:
    r"""Load a problem set from any JSONL or Parquet file with a problem and an answer per row.

    Field names are configurable. Left at their defaults, ``problem_field`` falls back to the
    first of ``"question"``, ``"Problem"``, ``"Question"`` and ``answer_field`` to the first of
    ``"Answer"``, ``"final_answer"``, ``"expected_answer"`` that the file has
    (:data:`PROBLEM_FIELDS`, :data:`ANSWER_FIELDS`); the choice is logged at INFO level on
    the ``lensprobe.evals.problems.load`` logger. Answers become strings (``42`` -> ``"42"``,
    surrounding whitespace stripped, GSM8K's ``"... #### N"`` cut to ``"N"``); nothing else
    in them is changed (AIME 2022-2024 keeps answers such as ``"033"``: the ``math-verify``
    grader equates them with ``33``, the ``"paper"`` string grader does not). The rows are read
    in file order.

    AIME (the meaningless-tokens paper's AIME2024 and AIME2025 tasks; the files are not
    shipped with lensprobe, pass their paths):

    - ``aime2025.jsonl`` (``question``, ``answer``; 30 problems): ``load_problems(path)``
      reads ``question`` as the problem, ids ``"aime2025-0"`` ... ``"aime2025-29"``.
    - ``aime_2022_2024.jsonl`` (``id``, ``problem``, ``answer``, ``url``; 90 problems, AIME
      2022-2024, the set the paper's code loads for "AIME2024"): ``load_problems(path)``;
      ids are the ``id`` field (``"0"`` ... ``"89"``), or ``id_field="url"`` for ids naming
      the source; ``keep=lambda row: "2024_AIME" in row["url"]`` keeps the 30 problems of 2024.

    Args:
        path: a ``.jsonl`` file (one JSON object per line; ``.ndjson`` and ``.json`` too,
            ``.json`` may also hold a list of objects) or a ``.parquet`` file (needs
            ``pyarrow``).
        problem_field: the column holding the question text.
        answer_field: the column holding the reference answer (a string or a number).
        id_field: the column holding each problem's id (every row needs one; converted to
            str). ``None``: ``unique_id`` or ``id`` when the row has one, else
            ``"<file stem>-<row index>"`` (0-based over the file's rows, blank lines skipped),
            stable whatever ``keep``, ``limit`` or ``seed`` select.
        subject_field, level_field: optional columns for per-subject and per-level accuracy
            (``None``, or a default name the file lacks: no subject or level).
        file_format: ``"jsonl"`` or ``"parquet"``; ``None`` tells it from the suffix.
        keep: keep only the rows (dicts of the file's fields) for which this returns true;
            applied before the rows are checked, so dropped rows may lack fields.
        subjects, levels, limit, seed: as in :func:`load_math500`: filter, then shuffle with
            ``seed``, then keep the first ``limit``.

    Returns:
        A list of :class:`Problem`, like :func:`load_math500`'s.

    Raises:
        LensprobeError: the file is missing or unreadable, a line is not valid JSON (with its
            line number), no column holds the problem or the answer (the message lists the
            file's columns), a row lacks a value, two rows share an id, or nothing is left.

    Example:
        >>> aime = lp.evals.load_problems("data/aime/aime2025.jsonl")       # the 'question' field
        >>> len(aime), aime[0].id, aime[0].answer
        (30, 'aime2025-0', '70')
        >>> gsm = lp.evals.load_problems("gsm8k/test.parquet", problem_field="question", limit=100)
    """
    path = Path(path).expanduser()
    fmt = format_of(path, file_format)
    read, unit = read_rows(path, fmt)
    rows: list[tuple[int, dict]] = []
    for n, row in read:
        if not isinstance(row, dict):
            raise LensprobeError(f"{path} {unit} {n}: expected a JSON object, got {type(row).__name__}.")
        rows.append((n, row))
    if not rows:
        raise LensprobeError(f"{path} holds no problems: expected one row per problem.")
    columns = list(dict.fromkeys(key for _, row in rows for key in row))
    fields = _Fields(
        problem=_pick_field(columns, problem_field, "problem", PROBLEM_FIELDS, "problem_field", path),
        answer=_pick_field(columns, answer_field, "answer", ANSWER_FIELDS, "answer_field", path),
        id=None if id_field is None else _pick_field(columns, id_field, "", (), "id_field", path),
        subject=_optional_field(columns, subject_field, "subject", "subject_field", path),
        level=_optional_field(columns, level_field, "level", "level_field", path),
    )
    if keep is not None and not callable(keep):
        raise LensprobeError(f"keep must be a function of a row (a dict) returning True or False, got {keep!r}.")
    stem = path.stem
    problems = [
        _problem_from_row(row, str(path), n, fields, default_id=f"{stem}-{index}", unit=unit)
        for index, (n, row) in enumerate(rows)
        if keep is None or keep(row)
    ]
    if not problems:
        raise LensprobeError(f"keep dropped every row of {path}: loosen it.")
    _check_unique_ids(problems, str(path))
    return _select(problems, str(path), subjects, levels, limit, seed)
