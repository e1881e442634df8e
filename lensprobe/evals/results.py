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
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import pandas

try:  # POSIX: results files are locked while written
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX: no lock
    fcntl = None

if TYPE_CHECKING:
    import pandas as pd

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
    out.mkdir(parents=True, exist_ok=True)
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


def _iter_rows(path: Path) -> Iterator[dict]:
    data = path.read_bytes()
    if not data:
        return
    lines = data.split(b"\n")
    # The last piece is b"" when the file ends with a newline, else a row cut off by a crash.
    for line_no, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as err:
            raise LensprobeError(
                f"{path} line {line_no} is not valid JSON ({err.msg}); the file was edited or damaged: "
                "delete that line to rerun the row."
            ) from None


def read_rows(out_dir: str | os.PathLike) -> list[dict]:
    """Every complete row of every results file in the folder (rank files merged)."""
    out = Path(out_dir)
    rows: list[dict] = []
    for path in sorted(out.glob(RESULTS_GLOB)):
        rows.extend(_iter_rows(path))
    return rows


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
    duplicate rows (never written by lensprobe) keep their first copy.

    Example:
        >>> df = load_results("runs/smollm2")
        >>> lp.evals.accuracy(df, "condition")
    """
    pd = pandas()
    cfg = read_config(out_dir)
    rows = read_rows(out_dir)
    if not rows:
        return pd.DataFrame(columns=["condition", "problem_id", "sample"])
    df = with_verdict_column(pd.DataFrame.from_records(rows), "paper-exact")
    df = df.drop_duplicates(subset=list(ROW_KEY), keep="first")
    order = {name: i for i, name in enumerate(cfg.get("conditions", {}))}
    df = df.assign(_c=df["condition"].map(order).fillna(len(order)))
    return df.sort_values(["_c", "problem_id", "sample"], kind="stable").drop(columns="_c").reset_index(drop=True)


class RowWriter:
    """Appends rows to one results file: one ``write`` + ``flush`` per row, ``fsync`` on :meth:`sync`.

    Holds an exclusive lock on the file, so two processes never write the same file (run
    sharded processes with distinct ranks).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "a+b")  # noqa: SIM115 - closed in close()
        try:
            if fcntl is not None:
                fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._fh.close()
            raise LensprobeError(
                f"{self.path} is being written by another process: wait for it, or give this run "
                "another output folder (sharded runs need distinct ranks)."
            ) from None
        self._drop_partial_tail()

    def _drop_partial_tail(self) -> None:
        fh = self._fh
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        if size == 0:
            return
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return
        fh.seek(0)
        data = fh.read()
        keep = data.rfind(b"\n") + 1
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())

    def write(self, row: dict[str, Any]) -> None:
        line = json.dumps(row, ensure_ascii=False) + "\n"
        self._fh.write(line.encode("utf-8"))
        self._fh.flush()

    def sync(self) -> None:
        with contextlib.suppress(OSError):
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self.sync()
            self._fh.close()

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_many_results(folders) -> "pd.DataFrame":
    """Rows of several result folders as one table; two folders of one model are told apart by folder name."""
    pd = pandas()
    frames = []
    for folder in folders:
        folder = Path(folder)
        df = load_results(folder)
        if len(df) == 0:
            raise LensprobeError(f"{folder} holds no result rows yet.")
        frames.append(df.assign(_folder=folder.name))
    rows = pd.concat(frames, ignore_index=True)
    # Two folders of the same model (e.g. two settings): tell them apart by folder name.
    for model, part in rows.groupby("model"):
        if part["_folder"].nunique() > 1:
            mask = rows["model"] == model
            rows.loc[mask, "model"] = rows.loc[mask, "model"] + " (" + rows.loc[mask, "_folder"] + ")"
    return rows.drop(columns="_folder")
