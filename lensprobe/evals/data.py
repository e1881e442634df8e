"""Evaluation problems: MATH-500 from a local JSONL file or the hub, or any problem/answer JSONL.

A problem set is a list of :class:`Problem`. :func:`load_math500` reads

- with no path, the MATH-500 copy lensprobe ships (:func:`math500_path`), offline;
- a local JSONL file with one JSON object per line holding at least ``problem`` and
  ``answer`` (MATH-500's own file, or your own set: GSM8K-style rows work too, see below);
- ``"hub"``: the hub dataset ``HuggingFaceH4/MATH-500`` through ``datasets``.

Optional fields: ``subject`` and ``level`` (used for per-subject and per-level accuracy)
and ``unique_id`` or ``id`` (the problem's id in result files; otherwise ``"line-N"``).
"""

import json
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import heavy

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


PACKAGED_MATH500 = Path(__file__).resolve().parent / "math500" / "test.jsonl"
"""MATH-500 as shipped with lensprobe (MIT License; source in ``math500/README.md`` beside it)."""


def math500_path() -> Path:
    """The MATH-500 file lensprobe reads: ``$LENSPROBE_MATH500`` when set, else the copy it ships.

    Raises:
        LensprobeError: ``$LENSPROBE_MATH500`` names no file, or the shipped copy is missing
            (a broken installation: reinstall lensprobe).

    Example:
        >>> lp.math500_path().name
        'test.jsonl'
    """
    env = os.environ.get("LENSPROBE_MATH500")
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise LensprobeError(f"LENSPROBE_MATH500={env!r} is not a file: point it at a MATH-500 JSONL file, "
                                 "or unset it to use the copy lensprobe ships.")
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


def _problem_from_row(row, where: str, line_no: int) -> Problem:
    if not isinstance(row, dict):
        raise LensprobeError(f"{where} line {line_no}: expected a JSON object, got {type(row).__name__}.")
    for key in ("problem", "answer"):
        if key not in row or row[key] is None:
            raise LensprobeError(
                f"{where} line {line_no}: the row has no {key!r} field (fields: {sorted(row)}). "
                "Every row needs 'problem' and 'answer'; rename your fields or fix the row."
            )
    problem, answer = row["problem"], row["answer"]
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(problem, str) or not problem.strip():
        raise LensprobeError(f"{where} line {line_no}: 'problem' must be a non-empty string.")
    if not isinstance(answer, str) or not answer.strip():
        raise LensprobeError(f"{where} line {line_no}: 'answer' must be a non-empty string or number.")
    level = row.get("level")
    if isinstance(level, str):  # "Level 3" in the original MATH files
        digits = "".join(ch for ch in level if ch.isdigit())
        level = int(digits) if digits else None
    if level is not None and not isinstance(level, int):
        raise LensprobeError(f"{where} line {line_no}: 'level' must be an integer, got {level!r}.")
    pid = row.get("unique_id", row.get("id"))
    return Problem(
        id=str(pid) if pid is not None else f"line-{line_no}",
        problem=problem,
        answer=_gsm8k_answer(answer.strip()),
        subject=row.get("subject"),
        level=level,
    )


def read_jsonl_problems(path: str | os.PathLike) -> list[Problem]:
    """Read every problem of a JSONL file (blank lines are skipped).

    Raises:
        LensprobeError: the file is missing, a line is not valid JSON (the message gives
            its line number), a row lacks ``problem`` or ``answer``, or two rows share an id.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise LensprobeError(f"problem file not found: {path}. Check the path.")
    problems: list[Problem] = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise LensprobeError(
                    f"{path} line {line_no} is not valid JSON ({err.msg} at column {err.colno}): "
                    "fix or remove that line; the file must hold one JSON object per line."
                ) from None
            problems.append(_problem_from_row(row, str(path), line_no))
    if not problems:
        raise LensprobeError(f"{path} holds no problems: expected one JSON object per line.")
    _check_unique_ids(problems, str(path))
    return problems


def _check_unique_ids(problems: list[Problem], where: str) -> None:
    seen: set[str] = set()
    for p in problems:
        if p.id in seen:
            raise LensprobeError(
                f"{where}: two rows share the id {p.id!r}; ids ('unique_id' or 'id') must be unique "
                "because results are matched by id."
            )
        seen.add(p.id)


def _hub_problems() -> list[Problem]:
    try:
        datasets = heavy("datasets")
    except ImportError as err:
        raise LensprobeError(
            "loading MATH-500 from the hub needs the 'datasets' package (pip install datasets); "
            "or pass a local JSONL file: load_math500('path/to/test.jsonl')."
        ) from err
    try:
        ds = datasets.load_dataset(HUB_DATASET, split="test")
    except Exception as err:  # offline, hub errors, missing cache
        raise LensprobeError(
            f"could not load {HUB_DATASET!r} from the Hugging Face hub ({type(err).__name__}); "
            "this machine may be offline. Pass a local copy instead: "
            "load_math500('path/to/test.jsonl') (one JSON object per line with 'problem' and "
            "'answer'), or `--data PATH.jsonl` on the command line."
        ) from err
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


def load_math500(path: str | os.PathLike | None = None, *, subjects: str | list[str] | None = None,
                 levels: int | list[int] | None = None, limit: int | None = None,
                 seed: int | None = None) -> list[Problem]:
    """Load MATH-500 (or any problem/answer JSONL), optionally filtered, shuffled and cut.

    Args:
        path: ``None`` for the MATH-500 copy lensprobe ships (:func:`math500_path`); a local
            JSONL file; or ``"hub"`` to load ``HuggingFaceH4/MATH-500`` from the Hugging Face hub
            with ``datasets`` (offline this fails with a message saying to pass a path). Any JSONL
            with ``problem`` and ``answer`` fields works; an answer holding ``"#### N"``
            (GSM8K's format) is cut to ``N``.
        subjects: keep only these subjects (e.g. ``"Algebra"``); names must exist in the file.
        levels: keep only these levels (1-5 for MATH).
        limit: keep at most this many problems (after filtering and shuffling).
        seed: shuffle with this seed before ``limit``; ``None`` keeps file order.

    Returns:
        A list of :class:`Problem`.

    Example:
        >>> probs = load_math500("shared/data/math500/test.jsonl", levels=1, limit=20)
        >>> probs[0].answer
        '\\\\sqrt{51}'
    """
    hub = isinstance(path, str) and path in ("hub", HUB_DATASET)
    if path is None:
        path = math500_path()
    problems = _hub_problems() if hub else read_jsonl_problems(path)
    where = HUB_DATASET if hub else str(path)
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
