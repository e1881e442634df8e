"""Command-line options read from configuration dataclasses (simple-parsing, lensprobe/app/parsing.py): a
field becomes an option with its type, choices, default and help; a field whose default is None stays None
when not given; a recipe's settings and the same options on the command line make equal configurations."""

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import pytest

import lensprobe as lp
from lensprobe.app.cli import build_parser, main
from lensprobe.app.parsing import RENAMED, add_config, new_parser
from lensprobe.app.recipe import ReproduceConfig, load_recipe
from lensprobe.core.errors import SettingError
from lensprobe.evals.running.settings import EvalSettings
from lensprobe.experiments.head_settings import (
    AblationSettings,
    AttributionConfig,
    HeadSelection,
    MetricSettings,
)


@dataclass(frozen=True)
class Settings:
    """Settings of a test.

    Attributes:
        depth: how deep to go. A second sentence the help leaves out.
    """

    depth: int = 3
    width: int | None = None
    """the box's width (default: the screen's)"""
    mode: Literal["fast", "slow"] = "fast"
    """how to run"""
    dry_run: bool = False
    """only print what would run"""
    name: str = field(default="x", metadata={"help": "the name, from metadata"})
    hidden: object = field(default=None, metadata={"cmd": False})

    def __post_init__(self):
        if self.depth < 0:
            raise SettingError("depth", f"expected a whole number >= 0, got {self.depth}")


def parser_of(cls=Settings):
    parser = new_parser(prog="test")
    add_config(parser, cls, "settings")
    parser._preprocessing()
    return parser


def action(parser, flag: str) -> argparse.Action:
    return next(a for a in parser._actions if flag in a.option_strings)


def test_a_field_is_an_option_with_its_type_choices_default_and_help():
    parser = parser_of()
    depth, mode, dry = action(parser, "--depth"), action(parser, "--mode"), action(parser, "--dry-run")
    assert depth.type is int and depth.default == 3 and depth.help == "how deep to go"
    assert tuple(mode.choices) == ("fast", "slow") and mode.default == "fast" and mode.help == "how to run"
    assert dry.default is False and action(parser, "--name").help == "the name, from metadata"
    assert not any("--hidden" in a.option_strings for a in parser._actions)  # "cmd": False: no option
    shown = parser.format_help()
    assert "how deep to go (default: 3)" in shown and "--mode {fast,slow}" in shown
    args = parser.parse_args(["--depth", "5", "--mode", "slow", "--dry-run"])
    assert args.settings == Settings(depth=5, mode="slow", dry_run=True)
    assert not hasattr(args, "depth")  # read from the object: no flat namespace where two groups could collide


def test_bad_values_are_refused_by_the_type_the_choices_or_post_init(capsys):
    parser = parser_of()
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "medium"])
    assert "invalid choice: 'medium'" in capsys.readouterr().err
    with pytest.raises(SettingError, match="depth: expected a whole number >= 0, got -1"):
        parser.parse_args(["--depth", "-1"])


def test_a_field_with_default_none_not_given_stays_none():
    assert parser_of().parse_args([]).settings.width is None
    assert parser_of().parse_args(["--width", "80"]).settings.width == 80
    args = build_parser().parse_args(["eval", "--prompt-format", "paper"])
    assert args.settings.given() == {"prompt_format": "paper"}  # repetition_penalty & co.: not given
    assert args.settings.repetition_penalty is None and args.arm.given() == {}


def test_a_setting_not_given_comes_from_the_model_or_protocol(tiny, monkeypatch):
    monkeypatch.setattr(tiny.original_model.generation_config, "repetition_penalty", 1.05)  # undone after
    monkeypatch.setattr(tiny.original_model.generation_config, "do_sample", False)
    paper = EvalSettings(prompt_format="paper").resolve(tiny)
    assert (paper.max_new_tokens, paper.repetition_penalty) == (2048, 1.05)  # the model's, not EvalConfig's 1.0
    given = EvalSettings(prompt_format="paper", repetition_penalty=1.0).resolve(tiny)
    assert given.repetition_penalty == 1.0  # given: it wins
    assert EvalSettings().resolve(tiny) == lp.EvalConfig()
    assert EvalSettings(protocol="arm-aime-pass3", batch_size=2).resolve(tiny).n_samples == 20


def test_every_eval_config_field_is_an_eval_option():
    """A field added to EvalConfig is an option of `lensprobe eval`, not given unless given."""
    options = {f.name for f in dataclasses.fields(EvalSettings)}
    skipped = {f.name for f in dataclasses.fields(lp.EvalConfig) if not f.metadata.get("cmd", True)}
    assert options == {f.name for f in dataclasses.fields(lp.EvalConfig)} - skipped
    assert skipped == {"eos_token_id", "thinking", "think_when"}


def test_a_recipe_and_the_same_command_line_give_equal_configurations(tmp_path):
    recipe = tmp_path / "mine.toml"
    recipe.write_text('kind = "figure"\nfigure = "thinking-traces"\n[settings]\nlimit = 5\nquick = true\n'
                      'max_new_tokens = 64\ndata = ["aime2024=a.jsonl"]\n')
    from_recipe = load_recipe(str(recipe)).settings
    argv = ["reproduce", str(recipe), "--limit", "5", "--quick", "--max-new-tokens", "64", "--benchmark-data", "aime2024=a.jsonl"]
    from lensprobe.app.commands.reproduce import given_settings

    from_command_line = given_settings(build_parser().parse_args(argv))  # --limit, --quick, ...: the shared options
    assert from_recipe == from_command_line == ReproduceConfig(limit=5, quick=True, max_new_tokens=64,
                                                              benchmark_data=["aime2024=a.jsonl"])
    assert ReproduceConfig(limit=9).over(from_recipe) == dataclasses.replace(from_recipe, limit=9)  # given wins
    recipe.write_text('kind = "figure"\nfigure = "thinking-traces"\n[settings]\nlimit = 0\n')
    with pytest.raises(lp.LensprobeError, match="settings.limit: expected a whole number >= 1, got 0"):
        load_recipe(str(recipe))


def test_one_flag_per_concept_across_commands():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {name: {s for a in p._actions for s in a.option_strings} for name, p in sub.choices.items()}
    assert all("--out" in f for f in flags.values())
    assert all("--method" not in f for f in flags.values())
    assert {"--ablation"} <= flags["ablate"] & flags["sweep"] & flags["attribute"]
    assert "--attribution" in flags["attribute"]
    assert all("--arm-c" in flags[c] for c in ("eval", "reproduce", "mechanism"))
    assert all("--sample" not in flags[c] and "--random-heads" in flags[c] for c in ("attribute", "find-heads"))
    heads = {name: p for name, p in sub.choices.items() if "--heads" in flags[name]}
    assert set(heads) == {"ablate", "sweep", "attribute", "attention", "mechanism", "patch-heads"}
    for p in heads.values():  # one syntax: the L0H3 labels (and plain numbers: a head in every layer)
        assert next(a for a in p._actions if "--heads" in a.option_strings).type("0,L1H2") == "H0,L1H2"


def test_cli_defaults_are_the_library_defaults():
    args = build_parser().parse_args(["attribute"])
    assert args.config == AttributionConfig()
    assert args.config.attribution == "atp"  # lp.attribute_heads' default
    assert (args.MetricSettings, args.AblationSettings, args.HeadSelection) == (
        MetricSettings(), AblationSettings(), HeadSelection())
    assert args.HeadSelection.spec() == "all"


def test_an_old_spelling_works_with_a_one_line_note(tmp_path, capsys):
    assert ("sweep", "--method") in RENAMED
    assert main(["sweep", "--model", "tiny", "--heads", "L0H0", "--method", "mean", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "lensprobe: note: `sweep --method` is now --ablation (the old spelling will be removed)"
    assert "--ablation mean needs --reference" in err[1]
