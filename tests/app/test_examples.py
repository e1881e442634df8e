"""Every subcommand's --help ends with a runnable example; each example runs on the tiny test model (the
evaluation with two problems), or is parsed where a run is not feasible here; `lensprobe --help` lists the
subcommands by study."""

import shlex

import pytest

from lensprobe.app.cli import build_parser, main
from lensprobe.app.examples import EXAMPLES, STUDIES

PARSED_ONLY = {"demo", "reproduce", "eval-report"}  # every study at once, a recipe's models; a folder of rows


def test_every_subcommand_has_an_example_at_the_end_of_its_help(capsys):
    for command, example in EXAMPLES.items():
        assert main([command, "--help"]) == 0
        assert capsys.readouterr().out.rstrip().endswith(f"Example:\n  {example}")
    assert set(EXAMPLES) == {c for group in STUDIES.values() for c in group}


def test_lensprobe_help_groups_the_subcommands_by_study(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for study, commands in STUDIES.items():
        assert f"{study}:" in out and all(f"\n  {c} " in out for c in commands)


@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_the_example_runs_on_the_tiny_model(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(EXAMPLES[command])[1:]
    if command in PARSED_ONLY:
        assert build_parser().parse_args(argv).func is not None
        return
    if command == "eval":
        argv = [a if a != "4" else "2" for a in argv]  # two problems are enough here
    assert main([*argv, "--model", "tiny", "--no-progress"] if command != "trace" else [*argv, "--model", "tiny"]) == 0, \
        capsys.readouterr().err
