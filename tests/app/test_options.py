"""Command-line options generated from dataclass fields: names, types, choices, defaults and help come from
the field; the shared groups and the configurations' tables make the commands' options."""

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

import lensprobe as lp
from lensprobe.app.checks import positive_int
from lensprobe.app.cli import build_parser
from lensprobe.app.commands.armargs import ARM_FLAGS, ARM_OPTIONS
from lensprobe.app.commands.evals import EVAL_CHANGES, eval_config_from_args
from lensprobe.app.option_groups import EVAL_OPTIONS, GENERATION_OPTIONS
from lensprobe.app.options import Option, add_options, field_docs, option, option_values


@dataclass(frozen=True)
class Settings:
    """Settings of a test.

    Attributes:
        depth: how deep to go. A second sentence the help leaves out.
        width, height: the size of the box,
            in cells.
    """

    depth: int = 3
    width: int | None = None
    height: float = 1.5
    name: str = field(default="x", metadata={"help": "the name, from metadata"})
    mode: Literal["fast", "slow"] = "fast"
    """how to run (the docstring under the field)"""
    dry_run: bool = False
    """only print what would run"""
    cache: bool = True
    """keep a cache"""
    folder: Path = field(default=Path("out"), metadata=option(type=Path, metavar="DIR"))
    """where to write"""
    count: int = field(default=1, metadata=option(type=positive_int))
    """how many"""


@dataclass(frozen=True)
class Needed:
    """A field without a default is a required option."""

    question: str
    """the question"""


def parser_for(cls, options=None, **changes) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t")
    add_options(parser, cls, options, **changes)
    return parser


def test_names_types_choices_and_defaults_come_from_the_fields():
    parser = parser_for(Settings)
    args = parser.parse_args([])
    assert option_values(args, Settings) == {f.name: f.default for f in dataclasses.fields(Settings)}
    args = parser.parse_args(["--depth", "5", "--width", "2", "--height", "0.5", "--mode", "slow", "--dry-run",
                              "--no-cache", "--folder", "runs", "--count", "4"])
    assert Settings(**option_values(args, Settings)) == Settings(5, 2, 0.5, "x", "slow", True, False, Path("runs"), 4)
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "medium"])  # a Literal's values are the choices
    with pytest.raises(SystemExit):
        parser.parse_args(["--count", "0"])  # the field's option(type=...) checks more than int
    with pytest.raises(SystemExit):
        parser_for(Needed).parse_args([])  # no default: required
    assert parser_for(Needed).parse_args(["--question", "q"]).question == "q"


def test_help_comes_from_the_field_documentation():
    docs = field_docs(Settings)
    assert docs["depth"].startswith("how deep to go.") and docs["height"] == "the size of the box, in cells."
    assert docs["mode"] == "how to run (the docstring under the field)" and docs["name"] == "the name, from metadata"
    helps = {a.dest: a.help for a in parser_for(Settings)._actions}
    assert helps["depth"] == "how deep to go (default 3)"  # the first sentence, the default added
    assert helps["width"] == "the size of the box, in cells"  # default None: nothing to add
    assert helps["mode"] == "how to run (the docstring under the field; default fast)"
    assert helps["dry_run"] == "only print what would run" and helps["folder"] == "where to write (default out)"
    assert field_docs(lp.EvalConfig)["temperature"].startswith("sampling temperature")  # a base class's entry


def test_a_command_changes_flag_default_help_and_note():
    parser = parser_for(Settings, ["depth", "mode"], depth=Option(flag="--levels", default=None, note="or all"),
                        mode=Option(help="100% custom"))
    actions = {a.dest: a for a in parser._actions}
    assert set(actions) == {"help", "levels", "mode"}
    assert actions["levels"].help == "how deep to go (default 3); or all" and actions["levels"].default is None
    assert parser.format_help().count("100% custom") == 1  # '%' is escaped for argparse
    args = parser.parse_args(["--mode", "slow"])
    assert option_values(args, Settings, ["depth", "mode"], given=True, depth=Option(flag="--levels")) == {"mode": "slow"}
    with pytest.raises(TypeError, match=r"Settings has no field\(s\) \['colour'\]"):
        parser_for(Settings, ["colour"])


def test_a_field_without_documentation_is_refused():
    @dataclass
    class Bare:
        size: int = 1

    with pytest.raises(TypeError, match=r"Bare.size has no documentation .* --size"):
        parser_for(Bare)
    assert parser_for(Bare, size=Option(help="the size")).parse_args([]).size == 1


def test_every_option_of_every_command_is_described():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        for action in command._actions:
            assert action.help and action.help.strip(), (name, action.option_strings)
        command.format_help()  # every help text formats


def test_the_tables_name_fields_of_their_configurations():
    assert set(GENERATION_OPTIONS) <= {f.name for f in dataclasses.fields(lp.GenerationConfig)}
    assert set(EVAL_OPTIONS) <= {f.name for f in dataclasses.fields(lp.EvalConfig)}
    assert set(ARM_OPTIONS) <= {f.name for f in dataclasses.fields(lp.ARM)}
    assert ARM_FLAGS == {"c": "arm_c", "percentile": "arm_percentile", "p_min": "arm_p_min", "variant": "arm_variant"}


def test_eval_options_make_the_eval_config():
    parser = argparse.ArgumentParser()
    add_options(parser, lp.EvalConfig, EVAL_OPTIONS, **EVAL_CHANGES)
    config = eval_config_from_args(parser.parse_args(["--batch-size", "4", "--sample", "--n-samples", "3",
                                                      "--extract", "last-number"]), None)
    assert config == lp.EvalConfig(batch_size=4, do_sample=True, n_samples=3, extract="last-number")
    assert eval_config_from_args(parser.parse_args([]), None) == lp.EvalConfig()
    pass3 = eval_config_from_args(parser.parse_args(["--protocol", "arm-aime-pass3", "--batch-size", "2"]), None)
    assert (pass3.protocol, pass3.n_samples, pass3.prompt_format, pass3.batch_size) == ("arm-aime-pass3", 20, "paper", 2)
