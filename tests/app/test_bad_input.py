"""Bad input to the ``lensprobe`` command: exit code 2 and one line saying what to fix, before any model
loads; unexpected errors: one line and a log file. The README's bad-input table is made from these cases."""

import json
import re
import shlex
import struct
from pathlib import Path

import pytest

from lensprobe.app import cli
from lensprobe.app.cli import main

README = Path(__file__).resolve().parents[2] / "docs" / "cli.md"  # the bad-input table lives there
BEGIN, END = "<!-- bad-input table (tests/app/test_bad_input.py) -->", "<!-- end of bad-input table -->"

# (what is wrong, the command as typed in a folder prepared by `prepare`, a fragment of the one line printed)
CASES = [
    ("`--out` is a file", "lensprobe attention --model tiny --question 'What is 2+3?' --out notes.txt",
     "--out notes.txt is a file: give a folder path"),
    ("`--out` is inside a file", "lensprobe eval --model tiny --out notes.txt/run",
     "--out notes.txt/run is inside notes.txt, which is a file"),
    ("`--out` cannot be written", "lensprobe sweep --model tiny --out /proc/lensprobe-sweep",
     "--out /proc/lensprobe-sweep: cannot write in /proc"),
    ("`--out` holds another command's output", "lensprobe trace --model tiny --question 'What is 2+3?' --out runs/a",
     "--out runs/a holds the output of another command (eval: config.json)"),
    ("a model file that is not GGUF", "lensprobe demo --model notes.gguf --out report",
     "notes.gguf is not a GGUF file (it starts with b'just', not b'GGUF')"),
    ("a truncated GGUF file", "lensprobe attention --model cut.gguf --question 'What is 2+3?' --out attn",
     "cut.gguf is truncated: its header describes 320 bytes but the file has 64"),
    ("a GGUF file that ends inside its header", "lensprobe mechanism --model head.gguf --question 'What is 2+3?' "
     "--out mech", "head.gguf ends inside its header: the file is truncated or damaged"),
    ("a missing model file", "lensprobe ablate --model missing.gguf --heads L0H1 --question 'What is 2+3?' --out abl",
     "GGUF file not found"),
    ("a model folder without `config.json`", "lensprobe attention --model models/empty --question x --out attn",
     "models/empty is a folder but holds no config.json"),
    ("one result folder given twice", "lensprobe eval-report runs/a runs/a",
     "result folder runs/a is given twice: name each folder once"),
    ("a result folder that is not one", "lensprobe eval-report notes",
     "notes holds no config.json: is it an evaluation output folder?"),
    ("half of the ARM settings", "lensprobe eval --model tiny --arm-c 0.1 --out runs/arm",
     "give both --arm-c and --arm-percentile"),
    ("an unknown option value", "lensprobe attention --question x --compare loud",
     "argument --compare: invalid choice: 'loud'"),
]


def tiny_gguf_header() -> bytes:
    """A GGUF (version 3) header announcing one float32 tensor of 64 values (256 bytes after the header)."""
    name = b"w"
    info = struct.pack("<Q", len(name)) + name + struct.pack("<IQIQ", 1, 64, 0, 0)
    return b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + info


def prepare(folder: Path) -> None:
    """The files the cases name."""
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "notes").mkdir()
    (folder / "runs" / "a").mkdir(parents=True)
    (folder / "runs" / "a" / "config.json").write_text(json.dumps({"config_hash": "h", "run": {}, "conditions": {}}))
    (folder / "notes.gguf").write_text("just text\n")
    header = tiny_gguf_header()
    assert len(header) == 57  # the data starts at 64 (32-byte alignment): 64 + 256 = 320 bytes make the whole file
    (folder / "cut.gguf").write_bytes(header.ljust(64, b"\0"))
    (folder / "head.gguf").write_bytes(header[:30])
    (folder / "models" / "empty").mkdir(parents=True)


def split(command: str) -> list[str]:
    return shlex.split(command)[1:]


def run_case(command: str, folder: Path, capsys) -> tuple[int, str]:
    rc = main(split(command))
    err = capsys.readouterr().err.split("\r")[-1]  # what stays on a terminal: the progress bar erases itself
    return rc, err.replace(f"{folder.resolve()}/", "").replace(f"{folder}/", "")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    prepare(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("what,command,fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_code_2(what, command, fragment, workdir, capsys):
    rc, err = run_case(command, workdir, capsys)
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("lensprobe"), err
    assert fragment in err, err


def test_nothing_is_created_by_a_refused_out_folder(workdir, capsys):
    for command in ("lensprobe eval --model tiny --out notes.txt/run", "lensprobe sweep --model tiny --out /proc/x"):
        assert main(split(command)) == 2
    assert sorted(p.name for p in workdir.iterdir()) == ["cut.gguf", "head.gguf", "models", "notes", "notes.gguf",
                                                        "notes.txt", "runs"]


def render_table(rows: list[tuple[str, str, str]]) -> str:
    lines = ["| input | what you see (exit code 2) |", "|---|---|"]
    for what, command, err in rows:
        shown = err.strip().replace("|", "\\|")
        code = f"`` {shown} ``" if "`" in shown else f"`{shown}`"  # a code span that may hold backticks
        lines.append(f"| {what}: `{command}` | {code} |")
    return "\n".join(lines)


def test_readme_table_shows_these_cases(workdir, capsys):
    rows = []
    for what, command, _ in CASES:
        rc, err = run_case(command, workdir, capsys)
        assert rc == 2
        rows.append((what, command, err))
    table = render_table(rows)
    text = README.read_text(encoding="utf-8")
    found = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    assert found and found.group(1) == table, (
        f"docs/cli.md's bad-input table is out of date; put this between {BEGIN} and {END}:\n{table}")


def test_an_unexpected_error_is_one_line_with_a_log_of_its_traceback(workdir, capsys, monkeypatch):
    monkeypatch.setenv("LENSPROBE_CACHE", str(workdir / "cache"))

    def broken(args):
        raise RuntimeError("wheels fell off\nsecond line")

    monkeypatch.setattr(cli, "SUBCOMMANDS", [*cli.SUBCOMMANDS, lambda sub: sub.add_parser("broken").set_defaults(
        func=broken)])
    assert main(["broken"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unexpected error: RuntimeError: wheels fell off (the traceback is in " in err
    log = Path(re.search(r"the traceback is in (\S+);", err).group(1))
    assert log.parent == workdir / "cache" / "logs"
    assert "Traceback (most recent call last)" in log.read_text() and "wheels fell off" in log.read_text()
    assert main(["broken", "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and 'raise RuntimeError("wheels fell off' in err
    assert main(["--debug", "eval-report", "runs/a", "runs/a"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().endswith("or its rows would be counted twice.")


def test_an_os_error_while_writing_is_one_line(workdir, capsys, monkeypatch):
    def full(args):
        raise OSError(28, "No space left on device", "report/index.html")

    monkeypatch.setattr(cli, "SUBCOMMANDS", [*cli.SUBCOMMANDS, lambda sub: sub.add_parser("full").set_defaults(
        func=full)])
    assert main(["full"]) == 2
    err = capsys.readouterr().err
    assert err == ("lensprobe: error: cannot use report/index.html: No space left on device. Check the path, its "
                   "permissions and the free disk space.\n")
