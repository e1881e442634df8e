"""A run's settings file, ``config.json``: one layout for every kind of resumable run.

Every folder a resumable run keeps its results in (an evaluation, an ablation sweep, activation
patching, a trace set, any :func:`~lensprobe.core.storage.shards.run_sharded` run) records what the
run computes in ``config.json``, in one layout::

    {
      "layout": 1,                          # this file's layout (LAYOUT)
      "kind": "evaluation",                 # what the run computes
      "hash": "3f1c0a...",                  # digest of kind and settings: the run's identity
      "settings": {"identity": 2, ...},     # every resolved setting, by content
      "parts": {"w/o": {..., "hash": ...}}, # parts a run may add to later (an evaluation's
                                            # conditions); {} for the others
      "labels": {"model": "..."},           # names for people, beside the identity, never compared
      "digest": "9a0e2b..."                 # digest of the file's own content (the keys above)
    }

The settings are identities by content (:mod:`lensprobe.core.storage.identity`); every row a run
writes records the run's ``hash`` (and an evaluation row its condition's), and is checked against
this file whenever it is read. :func:`open_run` creates or checks the file (the one check for every
kind), :func:`read_run` reads it. A folder is refused, before anything is computed, when it holds

- another kind of run, or other settings: the error lists every setting that differs, nested
  (:func:`~lensprobe.core.storage.store.settings_diff`), e.g. ``generation.max_new_tokens: folder
  has 16, this run has 32``;
- a part of the same name with another definition (an evaluation's condition ``w/ Mless`` with
  another filler), listed the same way;
- rows but no ``config.json``: whose rows they are cannot be checked, and a new file would adopt
  them as this run's;
- the settings of an older lensprobe (``shards.json``, or a ``config.json`` of another layout or
  identity rule): its results cannot be checked against this run's, so they are not reused; the
  message says so and to rerun into a new folder (the old folder is left as it is). An evaluation
  folder of the earlier layout is still read (:func:`read_run`: its rows, reports), never resumed.

The file is checked whole before it is used: ``digest`` is the
:func:`~lensprobe.core.storage.jsonable.json_digest` of the rest of the file, so a file edited by hand
or damaged is refused, and a file without it (an older lensprobe's) is refused with what to do.

The file is replaced atomically (:func:`~lensprobe.core.storage.store.atomic_write_json`): readers
see the old file or the new one.

Example:
    >>> config = open_run("runs/x", "demo", {"v": 1})
    >>> config["kind"], config["settings"]
    ('demo', {'v': 1})
    >>> open_run("runs/x", "demo", {"v": 2})
    Traceback (most recent call last):
    LensprobeError: runs/x holds results of another 'demo' run:
      v: folder has 1, this run has 2
    Use a new output folder, or delete this one to start over.
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lensprobe.core.errors import LensprobeError
from lensprobe.core.storage.files import DATA_LIMIT, read_bytes
from lensprobe.core.storage.identity import identity_digest
from lensprobe.core.storage.jsonable import json_digest
from lensprobe.core.storage.runidentity import check_identity_rule
from lensprobe.core.storage.store import (
    NEW_FOLDER_FIX,
    atomic_write_json,
    diff_lines,
    open_folder,
    other_run_error,
    read_json,
    settings_diff,
)

__all__ = ["CONFIG_FILE", "LAYOUT", "OLD_SETTINGS_FILE", "open_run", "read_run", "run_hash"]

CONFIG_FILE = "config.json"
LAYOUT = 1
"""The layout of ``config.json`` this lensprobe writes and reads."""
OLD_SETTINGS_FILE = "shards.json"
"""Where sharded runs of older lensprobe versions kept their settings (refused)."""
_OLDER = ("so the folder's results cannot be checked against this run and are not reused. Rerun into a new output "
          "folder (or delete this one to start over); the old folder stays as it is.")


def run_hash(kind: str, settings: Mapping[str, Any]) -> str:
    """The identity of a run: a digest of what it computes (``kind``) and its ``settings`` (as JSON, numbers
    by value: :func:`~lensprobe.core.storage.identity.identity_digest`), so settings that
    :func:`~lensprobe.core.storage.store.settings_diff` finds equal have one hash.

    Example:
        >>> run_hash("demo", {"n": 16}) == run_hash("demo", {"n": 16.0})
        True
        >>> run_hash("demo", {"w": (1, 2)}) == run_hash("demo", {"w": [1, 2]})
        True
    """
    return identity_digest({"kind": kind, "settings": _as_json(settings)})


def read_run(out: str | os.PathLike, kind: str | None = None, *, rows: str | None = None) -> dict:
    """The ``config.json`` of the run folder ``out``, checked to be of this layout (and of ``kind``).

    Args:
        out: the folder.
        kind: the kind of run expected (``"evaluation"``); ``None`` accepts any.
        rows: the glob of the folder's row files (``"results-rank*.jsonl"``): a folder that holds
            rows but no ``config.json`` is refused for what it is.

    Raises:
        LensprobeError: no ``config.json`` (rows without one are named), a damaged file, a
            folder of an older lensprobe, or a run of another kind.

    Example:
        >>> read_run("runs/smol", "evaluation")["labels"]
        {'model': 'SmolLM2-135M-Instruct'}
    """
    out = Path(out)
    config = _recorded(out, reading=True)
    if config is None:
        if rows is not None:
            _refuse_rows_without_config(out, rows)
        what = f"{_article(kind)} {kind} output folder" if kind else "a run's output folder"
        raise LensprobeError(f"{out} holds no {CONFIG_FILE}: is it {what}?")
    if kind is not None and config["kind"] != kind:
        raise LensprobeError(f"{out} holds {_a(config['kind'])} run, not {_a(kind)}: give the folder of {_a(kind)} "
                             "run.")
    return config


def open_run(out: str | os.PathLike, kind: str, settings: Mapping[str, Any], *, parts: Mapping[str, dict] | None = None,
             labels: Mapping[str, Any] | None = None, rows: str | None = None, part_name: str = "part") -> dict:
    """Create the folder's ``config.json``, or check this run against the one there; returns the file's
    content after this run's parts are added.

    Args:
        out: the folder (created if missing).
        kind: what the run computes (``"evaluation"``, ``"ablation sweep"``, ``"patch"``, ...).
        settings: JSON-able identity of everything that changes the results.
        parts: name -> identity (with a ``"hash"`` entry) of parts this run may add to a folder
            holding the same settings (an evaluation's conditions); a part recorded under the same
            name must have the same hash.
        labels: names for people (the model's name), written with the first run and not compared.
        rows: the glob of the folder's row files: rows without a ``config.json`` are refused.
        part_name: what a part is, for errors (``"condition"``).

    Raises:
        LensprobeError: another kind of run, other settings or another definition of a part (the
            differences listed), rows without ``config.json``, or a folder of an older lensprobe.

    Example:
        >>> open_run("runs/e", "evaluation", {"identity": 2}, parts={"w/o": {"hash": "c1"}})["parts"]
        {'w/o': {'hash': 'c1'}}
    """
    out = open_folder(out)
    settings = _as_json(settings)
    digest = run_hash(kind, settings)
    parts = _as_json(parts or {})
    old = _recorded(out)
    if old is None:
        if rows is not None:
            _refuse_rows_without_config(out, rows)
        config = {"layout": LAYOUT, "kind": kind, "hash": digest, "settings": settings, "parts": parts,
                  "labels": _as_json(labels or {})}
        _write(out, config)
        return config
    if old["kind"] != kind:
        raise other_run_error(f"{out} holds results of {_a(old['kind'])} run, this is {_a(kind)} run")
    if old["hash"] != digest:
        raise other_run_error(f"{out} holds results of another {old['kind']!r} run",
                              diff_lines(settings_diff(old["settings"], settings)) or ["(details differ)"])
    for name, desc in parts.items():
        prev = old["parts"].get(name)
        if prev is not None and prev.get("hash") != desc.get("hash"):
            raise other_run_error(f"{out} already holds {part_name} {name!r} with a different definition",
                                  diff_lines(settings_diff(_without_hash(prev), _without_hash(desc)))
                                  or ["(details differ)"],
                                  fix=f"Rename the {part_name}, or: {NEW_FOLDER_FIX[0].lower()}{NEW_FOLDER_FIX[1:]}")
    merged = {**old["parts"], **parts}  # parts keep the order they were first run in
    if merged == old["parts"]:
        return old
    config = {**old, "parts": merged}
    _write(out, config)
    return config


def _write(out: Path, config: dict) -> None:
    """Write ``config.json`` with the digest of its own content."""
    atomic_write_json(out / CONFIG_FILE, {**config, "digest": json_digest(config)}, indent=2)


def _checked_digest(config: dict, path: Path) -> dict:
    """The file's content without its digest, the digest checked over the whole content."""
    content = {k: v for k, v in config.items() if k != "digest"}
    if "digest" not in config:
        raise LensprobeError(f"{path} has no digest of its content: it was written by an older lensprobe, {_OLDER}")
    if config["digest"] != json_digest(content):
        raise LensprobeError(f"{path} does not match its digest: it was edited or damaged since it was written, so "
                             "the folder's results cannot be checked against it. Use a new output folder, or delete "
                             "this one to start over.")
    return content


def _recorded(out: Path, *, reading: bool = False) -> dict | None:
    """The folder's ``config.json`` checked to be of this layout; ``None`` when there is none (and no
    older settings file either). ``reading``: an evaluation folder of the earlier layout is read as
    this layout (its rows record the hash it holds, so they are still checked), never resumed."""
    old = out / OLD_SETTINGS_FILE
    path = out / CONFIG_FILE
    if old.is_file() and not path.is_file():
        recorded = read_json(old, fix="delete the folder to start over")
        if isinstance(recorded, dict) and "identity" not in (recorded.get("settings") or {}):
            check_identity_rule(recorded.get("settings") or {}, out)  # the repr()-era message when it is that old
        raise LensprobeError(f"{out} was written by an older lensprobe, which kept a run's settings in "
                             f"{OLD_SETTINGS_FILE}; this lensprobe keeps every run's in {CONFIG_FILE} (layout "
                             f"{LAYOUT}), {_OLDER}")
    if not path.exists() and not path.is_symlink():  # a FIFO or a link to a device is refused by read_json
        return None
    config = read_json(path, fix="use a new output folder, or delete this one to start over")
    if not isinstance(config, dict):
        raise LensprobeError(f"{path} is not a run's settings (a JSON object): it was edited or damaged; use a new "
                             "output folder, or delete this one to start over.")
    if "layout" not in config and "config_hash" in config:  # an evaluation folder of an older lensprobe
        if reading:
            return {"layout": LAYOUT, "kind": "evaluation", "hash": config["config_hash"],
                    "settings": config.get("run") or {}, "parts": config.get("conditions") or {},
                    "labels": config.get("labels") or {}, "older": True}
        if "identity" not in (config.get("run") or {}):
            check_identity_rule(config.get("run") or {}, out)  # the repr()-era message when it is that old
    if config.get("layout") != LAYOUT:
        raise LensprobeError(f"{out} was written by an older lensprobe ({CONFIG_FILE} of "
                             f"{'another layout' if 'layout' in config else 'an older layout'}; this lensprobe "
                             f"writes layout {LAYOUT}), {_OLDER}")
    config = _checked_digest(config, path)
    missing = [k for k in ("kind", "hash", "settings", "parts", "labels") if k not in config]
    if missing or _malformed(config):
        raise LensprobeError(f"{path} lacks {', '.join(missing) or _malformed(config)}: it was edited or damaged; "
                             "use a new output folder, or delete this one to start over.")
    if "identity" in config["settings"] and not reading:
        check_identity_rule(config["settings"], out)
    return config


def _malformed(config: dict) -> str:
    """What of a ``config.json`` holding every entry is not of its type (``""``: nothing)."""
    bad = [f"a text {k!r}" for k in ("kind", "hash") if not isinstance(config[k], str)]
    bad += [f"an object {k!r}" for k in ("settings", "parts", "labels") if not isinstance(config[k], dict)]
    if isinstance(config["parts"], dict):
        bad += [f"an object for part {name!r}" for name, part in config["parts"].items() if not isinstance(part, dict)]
    return ", ".join(bad)


def _refuse_rows_without_config(out: Path, rows: str) -> None:
    """Refuse a folder that holds rows but no ``config.json``: whose rows they are cannot be checked,
    and a new ``config.json`` would adopt them as this run's."""
    for path in sorted(out.glob(rows)):
        lines = read_bytes(path, "row file", DATA_LIMIT).split(b"\n")[:-1]  # complete lines only
        line_no = next((n for n, line in enumerate(lines, start=1) if line.strip()), None)
        if line_no is None:
            continue
        raise LensprobeError(
            f"{out} holds result rows ({path.name} line {line_no}, ...) but no {CONFIG_FILE}: the run they belong to "
            f"cannot be checked, so they are neither counted nor resumed. Use a new output folder, or delete this "
            f"one (or move the {rows} files away) to start over.")


def _without_hash(part: Mapping[str, Any]) -> dict:
    return {k: v for k, v in part.items() if k != "hash"}  # the hash differs whenever anything does


def _as_json(data: Any) -> Any:
    """``data`` as it reads back from JSON (tuples become lists): what the file holds is what is compared."""
    return json.loads(json.dumps(data))


def _article(kind: str) -> str:
    return "an" if kind[:1].lower() in "aeiou" else "a"


def _a(kind: str) -> str:
    return f"{_article(kind)} {kind!r}"
