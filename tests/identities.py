"""Helpers of the identity tests: interventions and metrics whose ``repr`` cannot tell two of them apart,
and the result folders earlier formats wrote (``tests/fixtures/old-format`` and ``two-files-format``, each made
by its ``make.py``)."""

import dataclasses
import functools
import shutil
from pathlib import Path

import torch

from lensprobe.interventions import declare

OLD_FORMAT = Path(__file__).resolve().parent / "fixtures" / "old-format"
TWO_FILES_FORMAT = Path(__file__).resolve().parent / "fixtures" / "two-files-format"


@functools.partial(declare, name="add-row", version="1")
@dataclasses.dataclass(frozen=True)
class AddRow:
    """Adds row 0 of ``table`` ([rows, d_model]) to the residual stream after layer 0. A table of more than
    1000 values has a summarised repr, so two tables differing in one hidden element have the same repr."""

    table: torch.Tensor

    def hooks(self, model):
        return [("blocks.0.hook_resid_post", lambda act, hook: act + self.table[0].to(act.dtype))]


@functools.partial(declare, name="shift", version="1")
class Shift:
    """Adds ``by`` to the residual stream after layer 0; no ``__repr__``, so every Shift has the same one."""

    def __init__(self, by: float):
        self.by = by

    def hooks(self, model):
        return [("blocks.0.hook_resid_post", lambda act, hook: act + self.by)]


def two_tables(d_model: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Two [32, d_model] tables that differ in one element of row 0 (hidden from their repr)."""
    a = torch.zeros(32, d_model)
    b = a.clone()
    b[0, 10] = 0.5
    return a, b


def logprob_of(token_id: int):
    """A metric: the log-probability of ``token_id`` at the last position (two from this factory have the
    same stable repr)."""
    def metric(logits, prompt):
        return logits[:, -1].float().log_softmax(-1)[:, token_id]

    return declare(metric, name="logprob_of", version="1")


def old_folder(kind: str, tmp_path: Path) -> Path:
    """A copy of the previous format's ``kind`` folder (``eval``, ``sweep``, ``patch`` or ``traces``)."""
    return Path(shutil.copytree(OLD_FORMAT / kind, tmp_path / f"old-{kind}"))


def two_files_folder(kind: str, tmp_path: Path) -> Path:
    """A copy of a ``kind`` folder (``eval`` or ``sweep``) of the layout before one settings file:
    identities by content, an evaluation's ``config.json`` and a sharded run's ``shards.json``."""
    return Path(shutil.copytree(TWO_FILES_FORMAT / kind, tmp_path / f"two-files-{kind}"))


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file of ``folder`` with its bytes (to show a refused run changed nothing)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
