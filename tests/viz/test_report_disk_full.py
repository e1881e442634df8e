"""A full disk while the report is written: the error names the file that could not be written, and no
empty or partial report file is left behind (every report file is written atomically)."""

import errno
from pathlib import Path

import pandas as pd
import pytest

from lensprobe.core.errors import LensprobeError
from lensprobe.viz.report import Section, write_report

REAL_WRITE_TEXT = Path.write_text
REAL_TO_CSV = pd.DataFrame.to_csv


def _disk_full_after_open(path) -> None:
    """What a full disk does: the file is created, then the write fails."""
    open(path, "w").close()
    raise OSError(errno.ENOSPC, "No space left on device")


def _section() -> Section:
    return Section("Accuracy", tables={"numbers": pd.DataFrame({"a": [1, 2]})}, data={"summary": {"n": 2}})


# the file that meets the full disk -> (its stem, its suffix): a temporary file beside it has both
FILES = {"accuracy/numbers.csv": ("numbers", ".csv"), "accuracy/summary.json": ("summary", ".json"),
         "index.html": ("index", ".html"), "report.json": ("report", ".json")}


@pytest.mark.parametrize("failing", list(FILES))
def test_a_full_disk_names_the_file_and_leaves_no_empty_report_files(tmp_path, monkeypatch, failing):
    stem, suffix = FILES[failing]

    def hit(path) -> bool:
        name = Path(path).name
        return name.endswith(suffix) and name.lstrip(".").startswith(stem + ".")

    def write_text(self, *args, **kwargs):
        if hit(self):
            _disk_full_after_open(self)
        return REAL_WRITE_TEXT(self, *args, **kwargs)

    def to_csv(self, path, *args, **kwargs):
        if hit(path):
            _disk_full_after_open(path)
        return REAL_TO_CSV(self, path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    monkeypatch.setattr(pd.DataFrame, "to_csv", to_csv)
    out = tmp_path / "report"
    with pytest.raises(LensprobeError, match="No space left on device") as info:
        write_report(out, [_section()])
    message = str(info.value)
    assert str(out / failing) in message and "free" in message, message
    files = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in files if p.stat().st_size == 0], files  # no 0-byte report files
    assert not [p for p in files if ".tmp" in p.name], files  # no temporary files either


def test_the_report_still_writes_every_file(tmp_path):
    index = write_report(tmp_path / "r", [_section()])
    assert index.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert (tmp_path / "r" / "accuracy" / "numbers.csv").read_text().splitlines() == ["a", "1", "2"]
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["accuracy", "index.html", "report.json"]
