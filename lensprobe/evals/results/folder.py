"""Result folders: a configuration file plus append-only JSONL rows that survive crashes.

Layout of an output folder::

    config.json               the run's settings, its hash, and every condition's identity: the one
                              layout of every run's settings (:mod:`lensprobe.core.storage.runconfig`),
                              kind "evaluation", the conditions as its parts
    results-rank{R}.jsonl     one row per (condition, problem, sample), one file per process

Every row is written and flushed as soon as it is graded (``fsync`` after each batch), so a
crash loses at most the rows of the batch being generated. A row cut short by a crash
(the file's last line without a newline) is ignored when reading and removed before new
rows are appended. A rerun with the same folder skips finished rows. A folder whose
``config.json`` holds another configuration (model, generation settings, or a condition of
the same name with a different prompt or interventions) is refused.

Every row records the identity of its run (``config_hash``, ``condition_hash``) and is checked
against the folder's ``config.json`` whenever it is read (:func:`read_rows`: by resumes,
:func:`load_results` and ``eval-report``): a row of another run is refused, naming its file and
both identities, and so is a folder that holds rows but no ``config.json`` (a new one would
adopt them). Rows of one (condition, problem, sample) merge by the results store's one rule
(:func:`~lensprobe.core.storage.store.merge_rows`, :func:`settled_rows`).

The folder is kept by the results store, as sweeps, patching and trace sets are:
``config.json`` is written and checked by :func:`~lensprobe.core.storage.runconfig.open_run` (replaced
atomically; the settings that differ are listed), rows are appended by a
:class:`~lensprobe.core.storage.rowfiles.RowWriter` (one locked file per process), and rank 0 of a
sharded run waits for the other ranks with :func:`wait_for_rows`
(:func:`~lensprobe.core.storage.store.wait_for_units`).
"""

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from lensprobe.core.errors import LensprobeError, LensprobeWarning
from lensprobe.core.lazy import pandas
from lensprobe.core.storage.rowfiles import (
    RowWriter as RowWriter,  # its old home: lensprobe.evals.results.folder.RowWriter
)
from lensprobe.core.storage.rowfiles import read_row_files
from lensprobe.core.storage.runconfig import CONFIG_FILE, open_run, read_run
from lensprobe.core.storage.store import merge_rows, wait_for_units
from lensprobe.evals.results.rows_check import check_row, check_row_identity, same_verdicts
from lensprobe.evals.results.runfacts import extract_of, mark_extract
from lensprobe.evals.results.verdicts import PAPER_EXACT, default_grader, mark_default_grader

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CONFIG_FILE", "EVAL_KIND", "ROW_KEY", "DuplicateRowsWarning", "RowWriter", "load_many_results", "load_results",
           "prepare_folder", "read_config", "read_rows", "results_file", "rows_frame", "settled_rows",
           "wait_for_rows", "with_verdict_column"]

EVAL_KIND = "evaluation"
"""The ``kind`` of an evaluation folder's ``config.json``."""
RESULTS_GLOB = "results-rank*.jsonl"
ROW_KEY = ("condition", "problem_id", "sample")


def results_file(out_dir: Path, rank: int) -> Path:
    return Path(out_dir) / f"results-rank{rank}.jsonl"


def read_config(out_dir: str | os.PathLike) -> dict:
    """The ``config.json`` of an evaluation folder (the one layout of every run's settings,
    :mod:`lensprobe.core.storage.runconfig`): ``settings`` (the model, generation settings),
    ``parts`` (each condition's identity, in the order they were first run), ``labels``, ``hash``.

    Raises:
        LensprobeError: no ``config.json`` (rows without one are named), a folder of another kind
            of run or of an older lensprobe.
    """
    return read_run(out_dir, EVAL_KIND, rows=RESULTS_GLOB)


def prepare_folder(out_dir: str | os.PathLike, run: dict, conditions: dict[str, dict], *, resume: bool = True,
                   labels: dict | None = None) -> dict:
    """Create or check an output folder for an evaluation (:func:`~lensprobe.core.storage.runconfig.open_run`).

    Args:
        out_dir: the folder.
        run: the run's identity (model, generation settings; :mod:`lensprobe.core.storage.identity`).
        conditions: name -> identity (with a ``"hash"`` entry) of each condition; a folder with the
            same settings gains the conditions it does not hold yet.
        resume: ``False`` refuses a folder that already holds results.
        labels: names for people (the model's name), kept beside the identity and not compared.

    Returns:
        The folder's ``config.json`` after this run's conditions are added (its ``"hash"`` is what
        every row of the run records).

    Raises:
        LensprobeError: the folder holds another configuration or kind of run (the settings that
            differ are listed), was written by an older lensprobe, or holds results when
            ``resume=False``.

    Example:
        >>> prepare_folder("runs/x", {"identity": IDENTITY_VERSION}, {"w/o": {"hash": "c1"}})["kind"]
        'evaluation'
    """
    config = open_run(out_dir, EVAL_KIND, run, parts=conditions, labels=labels, rows=RESULTS_GLOB,
                      part_name="condition")
    if not resume and any(Path(out_dir).expanduser().glob(RESULTS_GLOB)):
        raise LensprobeError(f"{out_dir} already holds results and resume is off: pick a new folder.")
    return config


def read_rows(out_dir: str | os.PathLike) -> list[dict]:
    """Every complete row of every results file in the folder (rank files merged,
    :func:`~lensprobe.core.storage.rowfiles.read_row_files`), in reading order, each checked: against the
    folder's identity (:func:`~lensprobe.evals.results.rows_check.check_row_identity`: rows of another run
    are refused), and field by field (:func:`~lensprobe.evals.results.rows_check.check_row`: a bad row is
    refused with its file and line, a ``NaN`` verdict makes an error row). Rows of one
    (condition, problem, sample) that disagree are refused (:func:`settled_rows`' merge rule).

    Raises:
        LensprobeError: a row of another run, a bad row, two finished rows that disagree, or rows
            in a folder without ``config.json``.
    """
    out = Path(out_dir)
    config = None
    located = []
    for path, line_no, row in read_row_files(out, RESULTS_GLOB):
        config = config or read_config(out)  # rows without config.json are refused there
        row = check_row(row, path, line_no)
        check_row_identity(row, config, path, line_no)
        located.append((f"{path} line {line_no}", row))
    _merge(located)
    return [row for _, row in located]


def _finished(row: dict) -> bool:
    return row.get("finish") != "error"


def _merge(located) -> dict:
    """The store's merge rule (:func:`~lensprobe.core.storage.store.merge_rows`) on ``(where, row)`` pairs."""
    return merge_rows(((where, tuple(row[k] for k in ROW_KEY), row) for where, row in located),
                      complete=_finished, agree=same_verdicts, fix="delete the wrong line")


def wait_for_rows(out_dir: str | os.PathLike, expected: set[tuple], problem_ids: list[str], world_size: int) -> None:
    """Wait (rank 0 of a sharded evaluation) until every ``expected`` row is in the folder.

    Problem ``i`` of ``problem_ids`` is evaluated by rank ``i % world_size``; the wait is the
    results store's (:func:`~lensprobe.core.storage.store.wait_for_units`), a problem being finished
    when all its expected rows are there.

    Raises:
        LensprobeError: no row reached the folder for :data:`~lensprobe.core.storage.store.STALL_TIMEOUT`
            seconds; names the ranks and problems missing. The rows written so far stay: rerun
            the same command to finish the others.
    """
    def look() -> tuple[int, set[str]]:
        rows = read_rows(out_dir)
        unfinished = {key[1] for key in expected - {tuple(r[k] for k in ROW_KEY) for r in rows}}
        return len(rows), set(problem_ids) - unfinished

    wait_for_units(out_dir, problem_ids, world_size, look, what="problem")


def settled_rows(rows: list[dict]) -> list[dict]:
    """One row per (condition, problem, sample), in first-seen order, by the results store's one
    merge rule (:func:`~lensprobe.core.storage.store.merge_rows`): the first finished row wins; an error row
    (``finish="error"``, retried on resume) counts only until a finished one comes (the last error
    row while none has); two finished rows whose verdicts differ are refused.

    Example:
        >>> [r["finish"] for r in settled_rows([{"condition": "w/o", "problem_id": "a", "sample": 0,
        ...   "finish": "error"}, {"condition": "w/o", "problem_id": "a", "sample": 0, "finish": "eos"}])]
        ['eos']
    """
    return list(_merge((f"row {i}", row) for i, row in enumerate(rows)).values())


def rows_frame(rows: list[dict]):
    """Result rows as a DataFrame: one row per (condition, problem, sample) (:func:`settled_rows`),
    with the ``paper-exact`` column present (``None`` in rows written before it existed)."""
    return with_verdict_column(pandas().DataFrame.from_records(settled_rows(rows)), PAPER_EXACT)


def with_verdict_column(df, column: str):
    """``df`` with ``column`` present: booleans, or ``None`` where a row has no verdict (rows
    written before that grader existed).

    Example:
        >>> with_verdict_column(pd.DataFrame({"x": [1]}), "paper-exact")["paper-exact"].tolist()
        [None]
    """
    if column not in df.columns:
        return df.assign(**{column: None})
    values = df[column]
    if values.isna().any():
        return df.assign(**{column: values.astype(object).where(values.notna(), None)})
    return df.assign(**{column: values.astype(bool)})


def load_results(out_dir: str | os.PathLike):
    """All rows of a result folder as a pandas DataFrame (one row per condition x problem x sample).

    Rows are sorted by condition (in the order of ``config.json``), problem id and sample;
    a row written again after an error row replaces it (:func:`settled_rows`); other
    duplicate rows (never written by lensprobe) keep their first copy, and are refused when
    their verdicts differ. Rows of another run are refused (:func:`read_rows`). The table's default
    verdict column (``df.attrs["default_grader"]``, :mod:`lensprobe.evals.results.verdicts`) is
    ``paper-exact`` for a folder evaluated in the authors' format, else ``math-verify``.

    Example:
        >>> df = load_results("runs/smollm2")
        >>> lp.evals.accuracy(df, "condition")
    """
    pd = pandas()
    cfg = read_config(out_dir)
    rows = read_rows(out_dir)
    if not rows:
        empty = pd.DataFrame(columns=["condition", "problem_id", "sample"])
        return mark_extract(mark_default_grader(empty, default_grader(cfg)), extract_of(cfg))
    df = rows_frame(rows)
    order = {name: i for i, name in enumerate(cfg["parts"])}
    df = df.assign(_c=df["condition"].map(order).fillna(len(order)))
    df = df.sort_values(["_c", "problem_id", "sample"], kind="stable").drop(columns="_c").reset_index(drop=True)
    return mark_extract(mark_default_grader(df, default_grader(cfg)), extract_of(cfg))


def _distinct_folders(folders) -> list[Path]:
    """The folders as paths, refusing one folder named twice (also under another spelling)."""
    seen: dict[Path, Path] = {}
    out = []
    for folder in folders:
        folder = Path(folder).expanduser()
        key = folder.resolve()
        if key in seen:
            same = "" if str(seen[key]) == str(folder) else f" (also as {seen[key]})"
            raise LensprobeError(f"result folder {folder} is given twice{same}: name each folder once, or its rows "
                                 "would be counted twice.")
        seen[key] = folder
        out.append(folder)
    return out


def load_many_results(folders) -> "pd.DataFrame":
    """Rows of several result folders as one table, each row counted once.

    Folders of one model with different settings (``config.json`` hashes) are told apart by
    folder name (``"model (folder)"``); folders of one model with the same settings are parts
    of one run and are merged. The default verdict column is ``paper-exact`` when every folder
    was evaluated in the authors' format, else ``math-verify``. A row found in several folders (same model, condition, problem
    and sample) is counted once, from the first folder given, with a warning.

    Raises:
        LensprobeError: a folder is given twice, or holds no rows.

    Example:
        >>> load_many_results(["runs/smol", "runs/qwen"])["model"].unique()
        array(['SmolLM2-135M-Instruct', 'Qwen2.5-Math-1.5B'], dtype=object)
    """
    pd = pandas()
    folders = _distinct_folders(folders)
    names = [f.name for f in folders]
    frames, defaults, extracts = [], set(), []
    for folder in folders:
        df = load_results(folder)
        if len(df) == 0:
            raise LensprobeError(f"{folder} holds no result rows yet.")
        defaults.add(df.attrs.get("default_grader"))
        extracts += df.attrs.get("extract", ())
        label = folder.name if names.count(folder.name) == 1 else str(folder)
        frames.append(df.assign(_folder=label, _hash=str(read_config(folder)["hash"])))
    rows = pd.concat(frames, ignore_index=True)
    # One model run with other settings in another folder: tell them apart by folder name.
    for model, part in rows.groupby("model"):
        if part["_hash"].nunique() > 1:
            mask = rows["model"] == model
            rows.loc[mask, "model"] = rows.loc[mask, "model"] + " (" + rows.loc[mask, "_folder"] + ")"
    key = ["model", *ROW_KEY]
    dup = rows.duplicated(subset=key, keep="first")
    if dup.any():
        where = sorted(set(rows.loc[dup, "_folder"]))
        first = rows.loc[dup, key].iloc[0].tolist()
        warnings.warn(
            f"{int(dup.sum())} row(s) of {', '.join(where)} are also in a folder given before it (e.g. model, "
            f"condition, problem, sample = {first}): each is counted once, from the first folder given.",
            DuplicateRowsWarning, stacklevel=2)
        rows = rows[~dup].reset_index(drop=True)
    # paper-exact by default only when every folder is in the authors' format
    rows = mark_default_grader(rows.drop(columns=["_folder", "_hash"]),
                               defaults.pop() if len(defaults) == 1 else "math-verify")
    return mark_extract(rows, *extracts)


class DuplicateRowsWarning(LensprobeWarning):
    """The same (model, condition, problem, sample) row was found in several result folders."""
