"""Edges of the row files (lensprobe.core.storage.rowfiles): blank and damaged lines, the files' order, the
writer's lock, mode and counters, short writes, a tail cut short, and its refusals once closed, failed or
deleted; every expected file is written out by hand."""

import errno
import os
import re

import pytest

import lensprobe as lp
import lensprobe.core.storage.rowfiles as rowfiles
from lensprobe.core.storage.rowfiles import RowWriter, read_row_file, read_row_files, row_line


def line(**row) -> bytes:
    """A row's line as the writer writes it (with its digest)."""
    return row_line(row).encode("utf-8")


# ----------------------------------------------------------------------------- reading
def test_blank_lines_are_skipped_but_counted_and_a_file_without_a_whole_line_has_no_rows(tmp_path):
    """Blank or space-only lines are skipped, the line numbers still count them; an empty file or one holding
    only a row cut short gives no rows."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(line(a=1) + b'\n  \n' + line(a=2))
    assert list(read_row_file(path)) == [(1, {"a": 1}), (4, {"a": 2})]
    path.write_bytes(b"")
    assert list(read_row_file(path)) == []
    path.write_bytes(b'{"a": 1')
    assert list(read_row_file(path)) == []


def test_a_row_edited_or_without_its_digest_is_refused_naming_the_line(tmp_path):
    """A line whose content no longer matches its digest (edited by hand, damaged in the middle of the file) is
    named; a line without a digest is an older lensprobe's, refused with what to do."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(line(a=1) + line(a=2).replace(b'"a": 2', b'"a": 3') + line(a=4))
    with pytest.raises(lp.LensprobeError, match=r"r\.jsonl line 2 does not match its row_digest: the row was edited "
                                                r"or damaged since it was written; delete that line"):
        list(read_row_file(path))
    path.write_bytes(line(a=1) + b'{"a": 2}\n')
    with pytest.raises(lp.LensprobeError, match=r"r\.jsonl line 2 has no row_digest: it was written by an older "
                                                r"lensprobe \(or by hand\).*Rerun into a new output folder"):
        list(read_row_file(path))
    path.write_bytes(line(a=1.5, b=[1, None], c="\u03c0") + line(t=(1, 2)))
    assert list(read_row_file(path)) == [(1, {"a": 1.5, "b": [1, None], "c": "\u03c0"}), (2, {"t": [1, 2]})]


def test_a_damaged_line_is_refused_naming_its_number_and_why(tmp_path):
    """Invalid JSON and bytes that are not UTF-8 are refused with the line number and the fix."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(line(a=1) + b'{"a": \n')
    with pytest.raises(lp.LensprobeError, match=r"r\.jsonl line 2 is not valid JSON \(Expecting value\); the file "
                                                r"was edited or damaged: delete that line to rerun the row\.$"):
        list(read_row_file(path))
    path.write_bytes(line(a=1) + b'{"a": "\xff"}\n')
    with pytest.raises(lp.LensprobeError, match=r"r\.jsonl line 2 is not valid JSON \(bytes that are not UTF-8\)"):
        list(read_row_file(path))
    with pytest.raises(lp.LensprobeError, match=r"^row file .*gone\.jsonl does not exist"):
        list(read_row_file(tmp_path / "gone.jsonl"))


def test_row_files_are_read_in_file_name_order(tmp_path):
    """read_row_files reads only the files matching the pattern, sorted by name (as text: 10 before 2)."""
    for name, n in (("r-2.jsonl", 2), ("r-10.jsonl", 10), ("r-1.jsonl", 1), ("other.jsonl", 0)):
        (tmp_path / name).write_bytes(line(n=n))
    got = [(path.name, line, row["n"]) for path, line, row in read_row_files(tmp_path, "r-*.jsonl")]
    assert got == [("r-1.jsonl", 1, 1), ("r-10.jsonl", 1, 10), ("r-2.jsonl", 1, 2)]


# ----------------------------------------------------------------------------- the writer
def test_the_writer_holds_a_lock_file_beside_its_file_unless_told_it_is_locked(tmp_path):
    """The lock is '.<name>.lock' beside the file while the writer is open, and refuses a second writer;
    locked=True takes none."""
    path = tmp_path / "results-rank0.jsonl"
    lock = tmp_path / ".results-rank0.jsonl.lock"
    assert RowWriter.lock_file(path) == lock
    with RowWriter(path):
        assert lock.exists()
        with pytest.raises(lp.LensprobeError, match=rf"^{re.escape(str(path))} is being written by another process "
                                                    r"\(.*\): wait for it, or give this run another output folder "
                                                    r"\(sharded runs need distinct ranks\)"):
            RowWriter(path)
    assert not lock.exists()
    with RowWriter(path, locked=True):
        assert not lock.exists()


def test_a_file_that_cannot_be_opened_is_refused_and_its_lock_released(tmp_path):
    """A results path that is a folder is refused with the fix, and the lock taken for it is given back."""
    path = tmp_path / "results-rank0.jsonl"
    path.mkdir()
    for _ in range(2):  # a second time: not 'being written by another process'
        with pytest.raises(lp.LensprobeError, match=r"^cannot open .*results-rank0\.jsonl for writing \(Is a "
                                                    r"directory\): choose an output folder you can write to\.$"):
            RowWriter(path)
    assert not (tmp_path / ".results-rank0.jsonl.lock").exists()


def test_the_writer_appends_utf8_rows_counts_them_and_makes_the_file_readable_by_others(tmp_path):
    """Rows are appended as UTF-8 text (not escaped), counted as written then synced, in a file of mode 0644."""
    path = tmp_path / "results-rank0.jsonl"
    path.write_bytes(line(old=0))
    umask = os.umask(0)
    os.umask(umask)
    with RowWriter(path) as writer:
        writer.write({"q": "\u03c0"})
        writer.write({"n": [1, 2]})
        assert (writer.written, writer.synced) == (2, 0)
        writer.sync()
        assert (writer.written, writer.synced) == (2, 2)
    assert path.read_bytes() == line(old=0) + line(q="\u03c0") + line(n=[1, 2])
    assert "\u03c0".encode() in path.read_bytes()  # UTF-8, not escaped
    fresh = tmp_path / "new.jsonl"
    RowWriter(fresh).close()
    assert fresh.stat().st_mode & 0o777 == 0o644 & ~umask


def test_short_writes_are_continued_until_the_row_is_whole(tmp_path, monkeypatch):
    """An os.write that takes 3 bytes at a time still writes the whole row; one that takes none is an error."""
    path = tmp_path / "results-rank0.jsonl"
    real_write = os.write
    writer = RowWriter(path)
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:3])))
    writer.write({"a": 12345})
    assert path.read_bytes() == line(a=12345)
    monkeypatch.setattr(os, "write", lambda fd, data: 0)
    with pytest.raises(lp.LensprobeError, match=r"^writing to .*results-rank0\.jsonl failed \(the operating system "
                                                r"wrote nothing\): 1 row\(s\) of this run are safely on disk\. Free "
                                                r"disk space \(or fix the storage\), then rerun the same command"):
        writer.write({"b": 1})
    monkeypatch.undo()
    writer.close()
    assert path.read_bytes() == line(a=12345)


def test_a_tail_cut_short_is_dropped_even_when_read_back_in_pieces(tmp_path, monkeypatch):
    """Opening a file whose last row was cut short keeps the whole rows (read 4 bytes at a time); a file with
    no whole row becomes empty; a failed write later cuts back to the kept rows."""
    path = tmp_path / "results-rank0.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": 3')
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: real_read(fd, min(n, 4)))
    writer = RowWriter(path)
    monkeypatch.undo()
    assert path.read_bytes() == b'{"a": 1}\n{"a": 2}\n'
    real_write = os.write

    def half_then_full(fd, data):
        real_write(fd, bytes(data[:4]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(lp.LensprobeError, match=r"failed \(No space left on device\): 0 row\(s\)"):
        writer.write({"a": 4})
    monkeypatch.undo()
    writer.close()
    assert path.read_bytes() == b'{"a": 1}\n{"a": 2}\n'
    path.write_bytes(b'{"a": 1')
    RowWriter(path).close()
    assert path.read_bytes() == b""


def test_a_writer_refuses_rows_once_its_file_is_deleted_or_it_is_closed(tmp_path):
    """A deleted results file (its folder still there) is named as the file; a closed writer says to open a new
    one; closing twice is fine."""
    path = tmp_path / "results-rank0.jsonl"
    writer = RowWriter(path)
    writer.write({"a": 1})
    path.unlink()
    with pytest.raises(lp.LensprobeError, match=rf"^the results file {re.escape(str(path))} was deleted during the "
                                                r"run: the 1 row\(s\) written so far are lost with it\. Rerun the "
                                                r"command to start again \(keep the folder until it ends\)\.$"):
        writer.write({"a": 2})
    writer.close()
    writer.close()
    other = RowWriter(tmp_path / "b.jsonl")
    other.close()
    with pytest.raises(lp.LensprobeError, match=r"^.*b\.jsonl is closed: open a new RowWriter to write to it\.$"):
        other.write({"a": 1})


def test_a_failed_sync_names_the_error_and_later_syncs_do_nothing(tmp_path, monkeypatch):
    """An fsync error without a message is named by itself; after a failure sync() and close() raise nothing."""
    writer = RowWriter(tmp_path / "r.jsonl")
    writer.write({"a": 1})
    calls = []

    def fsync(fd):
        calls.append(fd)
        raise OSError("the mount went away")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(lp.LensprobeError, match=r"^saving \(fsync\) .*r\.jsonl failed \(the mount went away\): 0 "
                                                r"row\(s\) of this run are safely on disk"):
        writer.sync()
    writer.sync()
    writer.close()
    assert len(calls) == 1


def test_a_row_file_is_read_up_to_the_data_limit_not_the_settings_limit(tmp_path, monkeypatch):
    """A row file is held to DATA_LIMIT (4 GiB), not to the 64 MiB of a settings file: lowered to 16 bytes here,
    a 19-byte file is refused."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 22}\n')  # 9 + 10 bytes
    monkeypatch.setattr(rowfiles, "DATA_LIMIT", 16)
    with pytest.raises(lp.LensprobeError, match=r"^row file .*r\.jsonl is 19 bytes, more than the 16 bytes"):
        list(read_row_file(path))


def test_a_failed_write_is_reported_even_when_the_cleanup_fails_too(tmp_path, monkeypatch):
    """When cutting the partial row or the fsync after a failed write fails as well, the write's error is
    still the one raised, and no row counts as saved whose fsync failed."""
    path = tmp_path / "results-rank0.jsonl"
    writer = RowWriter(path)
    writer.write({"a": 1})
    real_write = os.write

    def half_then_full(fd, data):
        real_write(fd, bytes(data[:4]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def broken(*args):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "write", half_then_full)
    monkeypatch.setattr(os, "ftruncate", broken)
    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(lp.LensprobeError, match=r"^writing to .*failed \(No space left on device\): 0 row\(s\) of "
                                                r"this run are safely on disk"):
        writer.write({"a": 2})
    monkeypatch.undo()
    writer.close()
    assert path.read_bytes() == line(a=1) + line(a=2)[:4]  # the cut failed: the partial row stays for the next opening


def test_a_results_file_replaced_by_another_is_refused_and_the_writer_stays_failed(tmp_path):
    """A results file deleted and made again by someone else is not this writer's file: refused, and every later
    row is refused as after a write error."""
    path = tmp_path / "results-rank0.jsonl"
    writer = RowWriter(path)
    writer.write({"a": 1})
    path.unlink()
    path.write_bytes(b"")
    with pytest.raises(lp.LensprobeError, match=r"^the results file .*results-rank0\.jsonl was deleted during the run: "
                                                r"the 1 row\(s\)"):
        writer.write({"a": 2})
    with pytest.raises(lp.LensprobeError, match=r"had a write error earlier: rerun the command to resume\.$"):
        writer.write({"a": 3})
    writer.close()
    assert path.read_bytes() == b""


def test_closing_a_writer_closes_its_file(tmp_path):
    """After close() the process holds no more open files than before (the results file and the lock's)."""
    before = sorted(os.listdir("/proc/self/fd"))
    writer = RowWriter(tmp_path / "results-rank0.jsonl")
    writer.write({"a": 1})
    assert len(os.listdir("/proc/self/fd")) == len(before) + 2
    writer.close()
    assert len(os.listdir("/proc/self/fd")) == len(before)


def test_a_tail_of_one_byte_is_dropped(tmp_path):
    """A row cut short after its first byte (only the last byte is not a newline) is dropped on opening."""
    path = tmp_path / "results-rank0.jsonl"
    path.write_bytes(b'{"a": 1}\n{')
    RowWriter(path).close()
    assert path.read_bytes() == b'{"a": 1}\n'
    path.write_bytes(b"{")
    RowWriter(path).close()
    assert path.read_bytes() == b""


def test_a_file_that_ends_sooner_than_its_size_is_cut_at_the_last_whole_row_read(tmp_path, monkeypatch):
    """When reading the tail gives nothing more before the size said (the file was cut meanwhile), the file is cut
    after the last whole row read and the writer appends after it."""
    path = tmp_path / "results-rank0.jsonl"
    path.write_bytes(line(a=1) + line(a=2) + b'{"a')
    real_read, given = os.read, []
    first = len(line(a=1))

    def read(fd, n):
        if n == 1:  # the last byte
            return real_read(fd, n)
        chunk = real_read(fd, min(n, first - sum(given)))
        given.append(len(chunk))
        return chunk

    monkeypatch.setattr(os, "read", read)
    writer = RowWriter(path)
    monkeypatch.undo()
    writer.write({"b": 1})
    writer.close()
    assert path.read_bytes() == line(a=1) + line(b=1)
