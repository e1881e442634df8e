"""Result folders: a configuration file plus append-only JSONL rows that survive crashes.

Layout of an output folder::

    config.json               run configuration, its hash, and every condition's description
    results-rank{R}.jsonl     one row per (condition, problem, sample), one file per process

Every row is written and flushed as soon as it is graded (``fsync`` after each batch), so a
crash loses at most the rows of the batch being generated. A row cut short by a crash
(the file's last line without a newline) is ignored when reading and removed before new
rows are appended. A rerun with the same folder skips finished rows. A folder whose
``config.json`` holds another configuration (model, generation settings, or a condition of
the same name with a different prompt or interventions) is refused.
"""

import contextlib
import errno
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import pandas
from lensprobe.core.locks import FileLock
from lensprobe.evals.rows_check import check_row, warn_disagreeing_rows
from lensprobe.evals.verdicts import PAPER_EXACT, default_grader, mark_default_grader

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CONFIG_FILE", "ROW_KEY", "DuplicateRowsWarning", "RowWriter", "load_many_results", "load_results",
           "prepare_folder", "read_config", "read_rows", "results_file", "rows_frame", "settled_rows",
           "with_verdict_column"]

CONFIG_FILE = "config.json"
RESULTS_GLOB = "results-rank*.jsonl"
ROW_KEY = ("condition", "problem_id", "sample")


def results_file(out_dir: Path, rank: int) -> Path:
    return Path(out_dir) / f"results-rank{rank}.jsonl"


def _diff(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, "<missing>"), new.get(key, "<missing>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: folder has {a!r}, this run has {b!r}")
    return out


def _atomic_write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # Keys keep their order: the conditions are listed in the order they were first run.
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_config(out_dir: str | os.PathLike) -> dict:
    """The ``config.json`` of a result folder."""
    path = Path(out_dir) / CONFIG_FILE
    if not path.is_file():
        raise LensprobeError(f"{out_dir} holds no {CONFIG_FILE}: is it an evaluation output folder?")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise LensprobeError(f"{path} is not valid JSON ({err.msg}); restore or delete it.") from None


def prepare_folder(out_dir: str | os.PathLike, run: dict, run_hash: str, conditions: dict[str, dict],
                   *, resume: bool = True) -> Path:
    """Create or check an output folder for a run.

    Args:
        out_dir: the folder.
        run: run configuration (model, generation settings) as JSON-able data.
        run_hash: hash of ``run``.
        conditions: name -> description (with a ``"hash"`` entry) of each condition.
        resume: ``False`` refuses a folder that already holds results.

    Raises:
        LensprobeError: the folder holds another configuration, or results when
            ``resume=False``.
    """
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise LensprobeError(f"output folder {out} is a file: give a folder path (it is created if missing).")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise LensprobeError(f"cannot create the output folder {out} ({err.strerror}): choose a folder you can "
                             "write to.") from None
    path = out / CONFIG_FILE
    merged = dict(conditions)
    if path.is_file():
        old = read_config(out)
        if old.get("config_hash") != run_hash:
            lines = _diff(old.get("run", {}), run)
            raise LensprobeError(
                f"{out} holds results of another configuration (hash {old.get('config_hash')}, this "
                f"run {run_hash}):\n  " + "\n  ".join(lines or ["(details differ)"])
                + "\nUse a new output folder, or delete this one to start over."
            )
        for name, desc in conditions.items():
            prev = old.get("conditions", {}).get(name)
            if prev is not None and prev.get("hash") != desc.get("hash"):
                lines = _diff(prev, desc)
                raise LensprobeError(
                    f"{out} already holds condition {name!r} with a different definition:\n  "
                    + "\n  ".join(lines) + "\nRename the condition, use a new output folder, or "
                    "delete this one."
                )
        if not resume and any(out.glob(RESULTS_GLOB)):
            raise LensprobeError(f"{out} already holds results and resume is off: pick a new folder.")
        merged = {**old.get("conditions", {}), **conditions}
        if merged == old.get("conditions"):
            return out
    _atomic_write_json(path, {"config_hash": run_hash, "run": run, "conditions": merged})
    return out


def _iter_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line number, checked row)`` for every complete line (:func:`~lensprobe.evals.rows_check.check_row`)."""
    data = path.read_bytes()
    if not data:
        return
    lines = data.split(b"\n")
    # The last piece is b"" when the file ends with a newline, else a row cut off by a crash.
    for line_no, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            why = err.msg if isinstance(err, json.JSONDecodeError) else "bytes that are not UTF-8"
            raise LensprobeError(
                f"{path} line {line_no} is not valid JSON ({why}); the file was edited or damaged: "
                "delete that line to rerun the row."
            ) from None
        yield line_no, check_row(row, path, line_no)


def read_rows(out_dir: str | os.PathLike) -> list[dict]:
    """Every complete row of every results file in the folder (rank files merged), each checked
    (:mod:`lensprobe.evals.rows_check`: a bad row is refused with its file and line, a ``NaN``
    verdict makes an error row, rows written twice with different verdicts are warned about)."""
    out = Path(out_dir)
    located = [(path, line_no, row) for path in sorted(out.glob(RESULTS_GLOB)) for line_no, row in _iter_rows(path)]
    warn_disagreeing_rows(located)
    return [row for _, _, row in located]


def settled_rows(rows: list[dict]) -> list[dict]:
    """One row per (condition, problem, sample), in first-seen order: the first row that ran,
    else the last error row (``finish="error"``, retried on resume).

    Example:
        >>> [r["finish"] for r in settled_rows([{"condition": "w/o", "problem_id": "a", "sample": 0,
        ...   "finish": "error"}, {"condition": "w/o", "problem_id": "a", "sample": 0, "finish": "eos"}])]
        ['eos']
    """
    kept: dict[tuple, int] = {}
    out: list[dict] = []
    for row in rows:
        key = tuple(row[k] for k in ROW_KEY)
        at = kept.get(key)
        if at is None:
            kept[key] = len(out)
            out.append(row)
        elif out[at].get("finish") == "error":
            out[at] = row
    return out


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
    duplicate rows (never written by lensprobe) keep their first copy. The table's default
    verdict column (``df.attrs["default_grader"]``, :mod:`lensprobe.evals.verdicts`) is
    ``paper-exact`` for a folder evaluated in the authors' format, else ``math-verify``.

    Example:
        >>> df = load_results("runs/smollm2")
        >>> lp.evals.accuracy(df, "condition")
    """
    pd = pandas()
    cfg = read_config(out_dir)
    rows = read_rows(out_dir)
    if not rows:
        return mark_default_grader(pd.DataFrame(columns=["condition", "problem_id", "sample"]), default_grader(cfg))
    df = rows_frame(rows)
    order = {name: i for i, name in enumerate(cfg.get("conditions", {}))}
    df = df.assign(_c=df["condition"].map(order).fillna(len(order)))
    df = df.sort_values(["_c", "problem_id", "sample"], kind="stable").drop(columns="_c").reset_index(drop=True)
    return mark_default_grader(df, default_grader(cfg))


class RowWriter:
    """Appends rows to one results file: one ``os.write`` per row, ``fsync`` on :meth:`sync`.

    Holds a :class:`~lensprobe.core.locks.FileLock` beside the file (``.results-rank{R}.jsonl.lock``),
    so two processes never write the same file (run sharded processes with distinct ranks); a
    lock left by a killed process is taken over with a warning. A failed write or ``fsync``
    (a full disk, a lost network mount) raises at once, saying how many rows are safely on
    disk; a row cut short by a failed write is removed.

    Attributes:
        written: rows written by this writer (handed to the operating system).
        synced: rows of this writer known to be on disk (fsynced).
    """

    @staticmethod
    def lock_file(path: Path) -> Path:
        """The lock file beside the results file ``path``."""
        return Path(path).with_name(f".{Path(path).name}.lock")

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = FileLock(
            self.lock_file(self.path),
            busy=f"{self.path} is being written by another process ({{holder}}): wait for it, or give this run "
                 "another output folder (sharded runs need distinct ranks).")
        self._lock.acquire()
        try:
            self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as err:
            self._lock.release()
            raise LensprobeError(f"cannot open {self.path} for writing ({err.strerror}): choose an output folder "
                                 "you can write to.") from None
        self.written = self.synced = 0
        self._failed = False
        try:
            self._size = self._drop_partial_tail()
        except BaseException:
            self._close_fd()
            raise

    def _drop_partial_tail(self) -> int:
        size = os.fstat(self._open_fd).st_size
        if size == 0:
            return size
        os.lseek(self._open_fd, size - 1, os.SEEK_SET)  # appends still go to the end (O_APPEND)
        if os.read(self._open_fd, 1) == b"\n":
            return size
        os.lseek(self._open_fd, 0, os.SEEK_SET)
        data = b""
        while len(data) < size:
            chunk = os.read(self._open_fd, size - len(data))
            if not chunk:
                break
            data += chunk
        keep = data.rfind(b"\n") + 1
        os.ftruncate(self._open_fd, keep)
        os.fsync(self._open_fd)
        return keep

    def _fail(self, err: OSError, doing: str) -> LensprobeError:
        self._failed = True
        with contextlib.suppress(OSError):  # remove a row cut short, so the file ends with a whole row
            if os.fstat(self._open_fd).st_size > self._size:
                os.ftruncate(self._open_fd, self._size)
        if doing == "writing to":  # the rows before the failed one may still reach the disk
            with contextlib.suppress(OSError):
                os.fsync(self._open_fd)
                self.synced = self.written
        return LensprobeError(
            f"{doing} {self.path} failed ({err.strerror or err}): {self.synced} row(s) of this run are safely on "
            "disk. Free disk space (or fix the storage), then rerun the same command: it resumes after them."
        )

    def write(self, row: dict[str, Any]) -> None:
        """Append one row (on disk after the next :meth:`sync`).

        Raises:
            LensprobeError: the operating system refused the write (e.g. the disk is full).
        """
        if self._failed:
            raise LensprobeError(f"{self.path} had a write error earlier: rerun the command to resume.")
        self._check_still_there()
        data = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._open_fd, view)
                if n <= 0:
                    raise OSError(errno.EIO, "the operating system wrote nothing")
                view = view[n:]
        except OSError as err:
            raise self._fail(err, "writing to") from err
        self._size += len(data)
        self.written += 1

    def _check_still_there(self) -> None:
        """Refuse to append to a file whose folder (or the file itself) was deleted: the rows would be lost."""
        try:
            here, ours = os.stat(self.path), os.fstat(self._open_fd)
            gone = (here.st_dev, here.st_ino) != (ours.st_dev, ours.st_ino)
        except OSError:
            gone = True
        if gone:
            self._failed = True
            what = (f"the output folder {self.path.parent}" if not self.path.parent.is_dir()
                    else f"the results file {self.path}")
            raise LensprobeError(f"{what} was deleted during the run: the {self.written} row(s) written so far are "
                                 "lost with it. Rerun the command to start again (keep the folder until it ends).")

    def sync(self) -> None:
        """Make every written row durable (``fsync``).

        Raises:
            LensprobeError: ``fsync`` failed: the rows since the last sync may not be on disk.
        """
        if self._failed:
            return
        try:
            os.fsync(self._open_fd)
        except OSError as err:
            raise self._fail(err, "saving (fsync)") from err
        self.synced = self.written

    @property
    def _open_fd(self) -> int:
        if self._fd is None:
            raise LensprobeError(f"{self.path} is closed: open a new RowWriter to write to it.")
        return self._fd

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        self._lock.release()

    def close(self) -> None:
        """Sync (unless a write failed), close the file and release the lock."""
        if self._fd is None:
            return
        try:
            self.sync()
        finally:
            self._close_fd()

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
    frames, defaults = [], set()
    for folder in folders:
        df = load_results(folder)
        if len(df) == 0:
            raise LensprobeError(f"{folder} holds no result rows yet.")
        defaults.add(df.attrs.get("default_grader"))
        label = folder.name if names.count(folder.name) == 1 else str(folder)
        frames.append(df.assign(_folder=label, _hash=str(read_config(folder).get("config_hash"))))
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
    return mark_default_grader(rows.drop(columns=["_folder", "_hash"]),
                               defaults.pop() if len(defaults) == 1 else "math-verify")


class DuplicateRowsWarning(UserWarning):
    """The same (model, condition, problem, sample) row was found in several result folders."""
