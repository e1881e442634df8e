"""The one contained writer: nothing outside a run's or report's folder is written or deleted, whatever
an edited listing says, and two outputs of one run never share a name."""

import json
import os

import pandas as pd
import plotly.graph_objects as go
import pytest

from lensprobe.core.errors import LensprobeError
from lensprobe.core.storage.locks import FileLock
from lensprobe.core.storage.outfolder import PAGES_FILE, replace_pages
from lensprobe.core.storage.rowfiles import RowWriter
from lensprobe.core.storage.writer import OutputFolder, open_in
from lensprobe.viz.report import Section, write_report


def _report(out, sections):
    return write_report(out, sections, title="t")


def _hostile_listing(out, slug, files):
    (out / "report.json").write_text(json.dumps({"sections": [{"slug": slug, "files": files}]}))


@pytest.mark.parametrize("entry", ["../victim/keep.txt", "ABSOLUTE"])
def test_a_report_listing_a_path_outside_deletes_nothing_and_says_so(tmp_path, entry):
    victim = tmp_path / "victim"
    victim.mkdir()
    keep = victim / "keep.txt"
    keep.write_text("mine")
    out = tmp_path / "rep"
    _report(out, [Section("A", tables={"t": pd.DataFrame({"a": [1]})})])
    entry = str(keep) if entry == "ABSOLUTE" else entry
    _hostile_listing(out, "victim", [entry, "a/t.csv"])
    with pytest.raises(LensprobeError, match=r"outside the report folder.*Nothing was deleted: delete report.json"):
        _report(out, [Section("B")])
    assert keep.read_text() == "mine"
    assert (out / "a" / "t.csv").is_file()  # refused before anything was deleted


def test_a_symlinked_section_folder_is_not_followed_out(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "t.csv").write_text("mine")
    out = tmp_path / "rep"
    out.mkdir()
    (out / "sec").symlink_to(victim, target_is_directory=True)
    _hostile_listing(out, "sec", ["sec/t.csv"])
    with pytest.raises(LensprobeError, match="symbolic link"):
        _report(out, [Section("B")])
    assert (victim / "t.csv").read_text() == "mine"


def test_writing_into_a_section_folder_that_links_out_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    out = tmp_path / "rep"
    out.mkdir()
    (out / "sec").symlink_to(victim, target_is_directory=True)
    with pytest.raises(LensprobeError, match="symbolic link"):
        _report(out, [Section("Sec", tables={"t": pd.DataFrame({"a": [1]})})])
    assert list(victim.iterdir()) == []


@pytest.mark.parametrize("section", [
    Section("S", tables={"a b": pd.DataFrame({"a": [1]}), "a-b": pd.DataFrame({"a": [2]})}),
    Section("S", figures=[go.Figure()], data={"figure 1": {"x": 1}}),
])
def test_two_outputs_of_one_section_on_one_name_are_refused_before_anything_is_written(tmp_path, section):
    with pytest.raises(LensprobeError, match=r"section 'S' has two outputs named s/\S+ .*Nothing was written"):
        _report(tmp_path / "rep", [section])
    assert not (tmp_path / "rep").exists()
    _report(tmp_path / "old", [Section("S", tables={"t": pd.DataFrame({"a": [1]})})])
    before = sorted(p.name for p in (tmp_path / "old").rglob("*"))
    with pytest.raises(LensprobeError, match="Nothing was written"):  # the earlier report is left whole
        _report(tmp_path / "old", [section])
    assert sorted(p.name for p in (tmp_path / "old").rglob("*")) == before


def test_row_and_lock_files_are_opened_inside_their_folder_never_through_a_link(tmp_path):
    """open_in, the one way a file is written in place (row files, lock files), refuses a path outside its
    folder and a link; RowWriter and FileLock go through it."""
    victim = tmp_path / "victim.jsonl"
    victim.write_text("mine\n")
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(LensprobeError, match=r"outside the run folder"):
        open_in(run, run / ".." / "victim.jsonl", os.O_RDWR | os.O_APPEND)
    (run / "results-rank0.jsonl").symlink_to(victim)
    with pytest.raises(LensprobeError, match=r"results-rank0\.jsonl is a symbolic link: lensprobe does not write "
                                             "through links"):
        RowWriter(run / "results-rank0.jsonl")
    assert not (run / ".results-rank0.jsonl.lock").exists()  # the lock taken first was released
    (run / ".x.lock").symlink_to(victim)
    with pytest.raises(LensprobeError, match=r"\.x\.lock is a symbolic link"):
        FileLock(run / ".x.lock").acquire()
    assert victim.read_text() == "mine\n"
    fd = open_in(run, run / "new.jsonl", os.O_RDWR | os.O_CREAT)
    os.close(fd)
    assert (run / "new.jsonl").is_file()


def test_a_rewritten_report_removes_its_own_earlier_files(tmp_path):
    out = tmp_path / "rep"
    _report(out, [Section("A", tables={"t": pd.DataFrame({"a": [1]})})])
    _report(out, [Section("B", tables={"t": pd.DataFrame({"a": [1]})})])
    assert not (out / "a").exists() and (out / "b" / "t.csv").is_file()


def test_a_pages_listing_naming_a_file_outside_deletes_nothing(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("mine")
    out = tmp_path / "run"
    out.mkdir()
    (out / "old.csv").write_text("x")
    (out / PAGES_FILE).write_text(json.dumps({"files": ["old.csv", "../keep.txt"]}))
    with pytest.raises(LensprobeError, match="outside its folder.*Nothing was deleted"):
        replace_pages(out, "lensprobe sweep", [])
    assert keep.read_text() == "mine" and (out / "old.csv").is_file()


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../x", "", ".."])
def test_the_writer_refuses_names_that_leave_the_folder(tmp_path, name):
    out = OutputFolder(tmp_path / "o")
    with pytest.raises(LensprobeError, match="the output folder"):
        out.write_text(name, "x")
    with pytest.raises(LensprobeError, match="the output folder"):
        out.remove(name)


def test_the_writer_refuses_a_second_output_on_one_name_and_keeps_the_first(tmp_path):
    out = OutputFolder(tmp_path / "o")
    out.write_text("a/t.csv", "first")
    with pytest.raises(LensprobeError, match="written twice by one run"):
        out.write_text("a/./t.csv", "second")
    assert (tmp_path / "o" / "a" / "t.csv").read_text() == "first"


def test_removing_a_link_removes_the_link_not_its_target(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("mine")
    out = OutputFolder(tmp_path / "o")
    (out.root / "link.txt").symlink_to(target)
    assert out.remove("link.txt")
    assert target.read_text() == "mine" and not (out.root / "link.txt").is_symlink()


def test_a_run_that_wrote_two_outputs_on_one_name_is_refused_at_its_end(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "a.csv").write_text("x")
    with pytest.raises(LensprobeError, match="written twice by one run"):
        replace_pages(out, "lensprobe sweep", [out / "a.csv", out / "sub" / ".." / "a.csv"])
    assert not (out / PAGES_FILE).exists()


def test_a_run_that_wrote_outside_its_folder_is_refused_at_its_end(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with pytest.raises(LensprobeError, match="written outside the output folder"):
        replace_pages(out, "lensprobe sweep", [tmp_path / "elsewhere.csv"])
