"""``--out`` folders are checked by one shared function before any model loads, in every command that has
one; the Python API refuses a file as output folder with the same kind of message."""

import argparse
import importlib

import pytest

import lensprobe as lp
from lensprobe.app.cli import build_parser, main
from lensprobe.app.common import OUTPUT_KINDS, check_out_dir

# The smallest argument list of each command with --out (the --out value is added).
MINIMAL_ARGS = {
    "attention": ["--question", "x"],
    "demo": [],
    "eval": [],
    "eval-report": ["runs/a"],
    "trace": ["--question", "x"],
    "ablate": ["--heads", "L0H1", "--question", "x"],
    "sweep": [],
    "attribute": [],
    "find-heads": [],
    "patch-heads": [],
    "mechanism": ["--question", "x"],
    "sinks": ["--question", "x"],
    "reproduce": ["arm-table1"],
}
COMMAND_MODULES = ["attention", "attribution", "demo", "evals", "heads", "mechanism", "patching", "reproduce", "sinks",
                   "trace"]


def commands_with_out() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name for name, p in sub.choices.items() if any("--out" in a.option_strings for a in p._actions)}


@pytest.fixture
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    for name in COMMAND_MODULES:
        module = importlib.import_module(f"lensprobe.app.commands.{name}")
        if hasattr(module, "load_cli_model"):
            monkeypatch.setattr(module, "load_cli_model", refuse)


def test_every_command_with_out_is_listed():
    assert commands_with_out() == set(MINIMAL_ARGS)


@pytest.mark.parametrize("command", sorted(MINIMAL_ARGS))
def test_every_command_checks_out_before_loading_the_model(command, tmp_path, monkeypatch, capsys, no_model_loads):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    assert main([command, *MINIMAL_ARGS[command], "--model", "tiny", "--out", "notes.txt"]
                if command != "eval-report" else [command, *MINIMAL_ARGS[command], "--out", "notes.txt"]) == 2
    assert capsys.readouterr().err == ("lensprobe: error: --out notes.txt is a file: give a folder path (it is "
                                       "created if missing).\n")


def test_check_out_dir(tmp_path):
    assert check_out_dir(tmp_path / "new" / "deeper", "attention") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # nothing created
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "sweep.json").write_text("{}")
    assert check_out_dir(tmp_path / "sweep", "sweep") == tmp_path / "sweep"  # its own kind: rerun in place
    for kind in sorted(set(OUTPUT_KINDS) - {"sweep"}):
        with pytest.raises(lp.LensprobeError, match=rf"holds the output of another command \(sweep: sweep.json\): "
                                                    rf"give this {kind} run its own folder"):
            check_out_dir(tmp_path / "sweep", kind)
    with pytest.raises(lp.LensprobeError, match=r"cannot write in /proc \("):
        check_out_dir("/proc/lensprobe-test", "trace")
    with pytest.raises(lp.LensprobeError, match="unknown output kind 'plots'; use one of attention, "):
        check_out_dir(tmp_path, "plots")


def test_the_evaluation_api_refuses_a_file_as_output_folder(tiny, tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    problems = [lp.evals.Problem(id="q0", problem="What is 1+1?", answer="2")]
    with pytest.raises(lp.LensprobeError, match=r"output folder .*notes.txt is a file: give a folder path"):
        lp.evaluate(tiny, problems, "w/o", out=tmp_path / "notes.txt", max_new_tokens=2, progress=False)
    with pytest.raises(lp.LensprobeError, match=r"cannot create the output folder .*notes.txt/run \(Not a directory\)"):
        lp.evaluate(tiny, problems, "w/o", out=tmp_path / "notes.txt" / "run", max_new_tokens=2, progress=False)
