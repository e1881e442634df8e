"""Edges of the results store (lensprobe.core.storage.store): the atomic writes' bytes, the merge rule's
defaults and incomplete rows, the settings diff over lists, mixed keys and non-mappings, the output
folder, the stall limit, and the wait, timed on a clock of its own (no test here sleeps)."""

import locale
import re
from pathlib import Path

import pytest

import lensprobe as lp
import lensprobe.core.storage.store as store
from lensprobe.core.storage.store import (
    atomic_write_json,
    atomic_write_text,
    merge_rows,
    open_folder,
    other_run_error,
    read_json,
    settings_diff,
    stall_limit,
    wait_for_units,
)


# ----------------------------------------------------------------------------- atomic writes
def test_atomic_write_text_writes_utf8_whatever_the_locale(tmp_path):
    """The text is written as UTF-8 even under an ASCII locale (not in the locale's encoding)."""
    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        got = atomic_write_text(str(tmp_path / "new" / "deeper" / "t.md"), "\u03c0 \u2248 3.14\n")
    finally:
        locale.setlocale(locale.LC_CTYPE, before)
    assert got == tmp_path / "new" / "deeper" / "t.md" and isinstance(got, Path)
    assert got.read_bytes() == b"\xcf\x80 \xe2\x89\x88 3.14\n"  # pi, almost-equal, by hand
    assert [p.name for p in got.parent.iterdir()] == ["t.md"]  # no temporary file left


def test_atomic_write_json_indents_by_one_space_and_ends_with_a_newline(tmp_path):
    """atomic_write_json writes one space of indent by default, the given indent otherwise, and a final newline."""
    got = atomic_write_json(tmp_path / "s.json", {"b": [1, 2.5], "a": None})
    assert got == tmp_path / "s.json"
    assert got.read_text(encoding="utf-8") == '{\n "b": [\n  1,\n  2.5\n ],\n "a": null\n}\n'
    atomic_write_json(tmp_path / "s.json", {"v": 1}, indent=2)
    assert (tmp_path / "s.json").read_text(encoding="utf-8") == '{\n  "v": 1\n}\n'


# ----------------------------------------------------------------------------- the merge rule
def test_merge_rows_by_default_refuses_two_different_rows_for_a_key_with_the_default_fix():
    """With the defaults every row is complete and rows agree when equal: a second, different row is refused."""
    assert merge_rows([("f0 line 1", "a", 1), ("f1 line 1", "b", 2), ("f1 line 2", "a", 1)]) == {"a": 1, "b": 2}
    expected = ("two results for 'a' disagree: f0 line 1 and f1 line 2. Which one is right cannot be told from the "
                "files: delete the wrong one, then rerun (it computes the key again if needed).")
    with pytest.raises(lp.LensprobeError, match=f"^{re.escape(expected)}$"):
        merge_rows([("f0 line 1", "a", 1), ("f1 line 1", "b", 2), ("f1 line 2", "a", 3)])


def test_merge_rows_keeps_the_last_incomplete_row_until_a_complete_one_then_ignores_incomplete_ones():
    """An incomplete row is replaced by a later one; a complete row is never replaced, nor refused for a later
    incomplete row that differs; keys stay in first-seen order."""
    def complete(row):
        return row["ok"]

    rows = [("r1", "a", {"v": 1, "ok": False}), ("r2", "b", {"v": 2, "ok": True}), ("r3", "a", {"v": 3, "ok": False})]
    merged = merge_rows(rows, complete=complete)
    assert merged == {"a": {"v": 3, "ok": False}, "b": {"v": 2, "ok": True}}
    more = [*rows, ("r4", "a", {"v": 4, "ok": True}), ("r5", "a", {"v": 5, "ok": False}),
            ("r6", "b", {"v": 6, "ok": False})]
    merged = merge_rows(more, complete=complete)
    assert merged == {"a": {"v": 4, "ok": True}, "b": {"v": 2, "ok": True}} and list(merged) == ["a", "b"]
    with pytest.raises(lp.LensprobeError, match="two results for 'a' disagree: r4 and r7"):
        merge_rows([*more, ("r7", "a", {"v": 7, "ok": True})], complete=complete)


# ----------------------------------------------------------------------------- settings and folders
def test_settings_diff_over_mixed_keys_lists_and_values_that_are_not_mappings():
    """Keys of mixed types are ordered by their text; lists of one length item by item (not at the top); a
    mapping against a non-mapping, or a list against a non-list, is one difference."""
    assert settings_diff({1: "a", "b": 2}, {1: "c", "b": 2, "z": 0}) == [(("1",), "a", "c"),
                                                                       (("z",), "<missing>", 0)]
    assert settings_diff({"a": 1}, 5) == [((), {"a": 1}, 5)]
    assert settings_diff(5, {"a": 1}) == [((), 5, {"a": 1})]
    assert settings_diff({"m": {"x": 1}}, {"m": None}) == [(("m",), {"x": 1}, None)]
    assert settings_diff({"i": [1, 2]}, {"i": 5}) == [(("i",), [1, 2], 5)]
    assert settings_diff({"i": 5}, {"i": [1, 2]}) == [(("i",), 5, [1, 2])]
    assert settings_diff({"i": [1, 2]}, {"i": [1, 2, 3]}) == [(("i",), [1, 2], [1, 2, 3])]
    assert settings_diff({"i": [1, {"c": 2}]}, {"i": [0, {"c": 3}]}) == [(("i", "0"), 1, 0),
                                                                       (("i", "1", "c"), 2, 3)]
    assert settings_diff([1, 2], [1, 3]) == [((), [1, 2], [1, 3])]  # lists at the top are compared whole
    assert settings_diff({"i": [1, [2]]}, {"i": [1, [2]]}) == []


def test_the_error_for_another_run_ends_with_the_fix_given():
    """other_run_error puts the given fix after the head, or after the setting lines."""
    assert str(other_run_error("runs/x differs", fix="Delete it.")) == "runs/x differs. Delete it."
    err = other_run_error("runs/x differs", ["a: 1", "b: 2"], fix="Delete it.")
    assert str(err) == "runs/x differs:\n  a: 1\n  b: 2\nDelete it."


def test_read_json_reads_the_file_and_names_the_default_fix_or_the_missing_file(tmp_path):
    """read_json returns the JSON; a damaged file ends with the default fix, a missing one is a settings file."""
    (tmp_path / "ok.json").write_text('{"kind": "demo", "n": [1, 2]}', encoding="utf-8")
    assert read_json(tmp_path / "ok.json") == {"kind": "demo", "n": [1, 2]}
    (tmp_path / "bad.json").write_text("[1,", encoding="utf-8")
    with pytest.raises(lp.LensprobeError, match=r"bad\.json is not valid JSON \(.+\): it was edited or damaged; "
                                                r"delete it to compute its units again\.$"):
        read_json(tmp_path / "bad.json")
    with pytest.raises(lp.LensprobeError, match=r"^settings file .*gone\.json does not exist"):
        read_json(tmp_path / "gone.json")


def test_open_folder_expands_the_home_folder_and_creates_missing_parents(tmp_path, monkeypatch):
    """open_folder('~/a/b') is the folder under $HOME, made with its missing parents, and opens again."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for _ in range(2):  # a second time: it exists already
        got = open_folder("~/a/b")
        assert got == tmp_path / "a" / "b" and got.is_dir()
    (tmp_path / "f").write_text("x", encoding="utf-8")
    with pytest.raises(lp.LensprobeError, match=r"^output folder .*f is a file: give a folder path \(it is created "
                                                r"if missing\)\.$"):
        open_folder(tmp_path / "f")
    with pytest.raises(lp.LensprobeError, match=r"^cannot create the output folder .*f/g \(Not a directory\): "
                                                r"choose a folder you can write to\.$"):
        open_folder(tmp_path / "f" / "g")


# ----------------------------------------------------------------------------- the stall limit and the wait
def test_the_stall_limit_unset_or_blank_is_the_default_and_a_bad_one_names_the_default(monkeypatch):
    """An unset or blank LENSPROBE_STALL_TIMEOUT gives 3600 s; a fraction of a second is allowed; the refusal
    says what to set."""
    monkeypatch.delenv("LENSPROBE_STALL_TIMEOUT", raising=False)
    assert stall_limit() == 3600.0
    monkeypatch.setenv("LENSPROBE_STALL_TIMEOUT", "   ")
    assert stall_limit() == 3600.0
    monkeypatch.setenv("LENSPROBE_STALL_TIMEOUT", "0.5")
    assert stall_limit() == 0.5
    monkeypatch.setenv("LENSPROBE_STALL_TIMEOUT", "soon")
    with pytest.raises(lp.LensprobeError, match=r"^LENSPROBE_STALL_TIMEOUT='soon' is not a positive number of "
                                                r"seconds: set it to one \(e\.g\. 600\) or unset it \(the default is "
                                                r"3600 s\)\.$"):
        stall_limit()


class Clock:
    """A clock for the wait: ``sleep`` moves it on, and a look may take time too."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(store, "time", clock)
    return clock


def test_the_wait_gives_up_only_after_more_than_the_limit_without_news(tmp_path, clock):
    """No news for exactly the limit is still waited on (0.5 s looks, limit 1 s: the 4th look at 1.5 s gives up),
    and the message names the ranks, the count, the first missing unit and the limit."""
    looks = []

    def look():
        looks.append(clock.now)
        return 1, {"u0"}

    expected = (f"gave up waiting in {tmp_path}: rank 0, rank 1 of 2 did not finish 2 unit(s) (e.g. 'u1') and "
                "nothing finished for 1 s. Check that process's output, then rerun the same command: it resumes "
                "where the ranks stopped (every finished unit is saved).")
    with pytest.raises(lp.LensprobeError, match=f"^{re.escape(expected)}$"):
        wait_for_units(tmp_path, ["u0", "u1", "u2"], 2, look, stall_timeout=1.0)
    assert looks == [0.0, 0.5, 1.0, 1.5] and clock.sleeps == [0.5, 0.5, 0.5]  # POLL_SECONDS between looks


def test_each_new_count_of_records_restarts_the_stall_clock(tmp_path, clock):
    """A slow but steady run (a new record every 1.5 s, limit 1 s) is waited for to its end."""
    counts = iter([1, 1, 1, 2, 2, 2, 3, 3, 3, 4])
    units = ["u0", "u1", "u2", "u3"]
    finished = set(units)

    def look():
        n = next(counts)
        return n, finished if n == 4 else set(units[:n])

    assert wait_for_units(tmp_path, units, 2, look, stall_timeout=1.0) is finished
    assert clock.now == 4.5


def test_the_stall_clock_starts_after_the_first_look(tmp_path, clock):
    """A first look slower than the limit (reading a large folder) is not a stall."""
    def look():
        if clock.now == 0.0:
            clock.now = 5.0
            return 1, set()
        return 1, {"u0"}

    assert wait_for_units(tmp_path, ["u0"], 1, look, stall_timeout=1.0) == {"u0"}


def test_the_wait_without_a_limit_reads_it_from_the_environment(tmp_path, clock, monkeypatch):
    """stall_timeout=None takes LENSPROBE_STALL_TIMEOUT (1.5 s: the look at 2 s gives up); a given limit wins."""
    monkeypatch.setenv("LENSPROBE_STALL_TIMEOUT", "1.5")
    with pytest.raises(lp.LensprobeError, match=r"nothing finished for 1\.5 s"):
        wait_for_units(tmp_path, ["u0"], 1, lambda: (0, set()), poll=0.5)
    assert clock.now == 2.0
    with pytest.raises(lp.LensprobeError, match=r"nothing finished for 0\.5 s"):
        wait_for_units(tmp_path, ["u0"], 1, lambda: (0, set()), stall_timeout=0.5, poll=0.5)
