"""Each setting declared once, one meaning per flag: every command's parser is enumerated from the real
``lensprobe`` parser; a flag means the same (help, type, choices) in every command that takes it; no two
fields make one flag and none is silently dropped; renamed flags stay accepted, with a note."""

import argparse
import dataclasses
from dataclasses import dataclass

import pytest
from simple_parsing.conflicts import ConflictResolutionError

from lensprobe.app.cli import build_parser, main, subcommand_names
from lensprobe.app.parsing import RENAMED, add_config, new_parser, renamed_flags
from lensprobe.core.errors import LensprobeError

PARSER = build_parser()
COMMANDS = {name: p for name, p in next(a for a in PARSER._actions
                                        if isinstance(a, argparse._SubParsersAction)).choices.items()}
SKIP = {"-h", "--help", "--debug"}


def options(command: str) -> list[argparse.Action]:
    return [a for a in COMMANDS[command]._actions if set(a.option_strings) - SKIP]


def meaning(action: argparse.Action) -> tuple:
    """What a flag means to its user: its help (without the default, which a command may choose), the type of
    its value, its choices and whether it takes one."""
    help_text = (action.help or "").removesuffix(" (default: %(default)s)")
    kind = getattr(action.type, "__name__", repr(action.type))
    return help_text, kind, tuple(action.choices or ()), action.nargs == 0


def test_the_commands_are_enumerated_from_the_real_parser():
    assert set(COMMANDS) == set(subcommand_names(PARSER))
    assert {"attention", "ablate", "sweep", "attribute", "find-heads", "eval", "trace", "reproduce"} <= set(COMMANDS)


def test_a_flag_in_several_commands_means_the_same_in_each():
    uses: dict[str, dict[tuple, list[str]]] = {}
    for command in COMMANDS:
        for action in options(command):
            for flag in action.option_strings:
                uses.setdefault(flag, {}).setdefault(meaning(action), []).append(command)
    shared = {flag: m for flag, m in uses.items() if sum(len(c) for c in m.values()) > 1}
    assert {"--heads", "--ablation", "--metric", "--tokens", "--system", "--filler", "--question"} <= set(shared)
    two = {flag: m for flag, m in shared.items() if len(m) > 1}
    assert two == {}, "flags with two meanings: " + "; ".join(
        f"{flag}: " + " | ".join(f"{cmds}: {m[0]!r} ({m[1]})" for m, cmds in ms.items()) for flag, ms in two.items())


def test_the_flags_that_had_two_meanings_have_one():
    flags = {c: {s for a in options(c) for s in a.option_strings} for c in COMMANDS}
    assert {c for c in COMMANDS if "--sample" in flags[c]} == {"eval", "trace"}  # sampling, never a head count
    assert {c for c in COMMANDS if "--top-k" in flags[c]} == {"eval", "trace"}  # the sampling cut-off
    assert {c for c in COMMANDS if "--batch-size" in flags[c]} == {"eval", "reproduce"}  # rows generated at once
    assert {c for c in COMMANDS if "--heads-per-forward" in flags[c]} == {"sweep", "attribute", "find-heads",
                                                                        "patch-heads"}
    assert {c for c in COMMANDS if "--random-heads" in flags[c]} == {"attribute", "find-heads"}
    assert "--show-tokens" in flags["ablate"] and "--compare" in flags["attention"]
    assert "--filler" not in flags["attention"]  # the condition a prompt is built with, elsewhere


def test_no_two_fields_make_one_flag_in_any_command():
    for command in COMMANDS:
        seen: dict[str, str] = {}
        for action in options(command):
            assert "." not in "".join(action.option_strings), (command, action.option_strings)  # no --sys.system
            for flag in action.option_strings:
                assert flag not in seen, f"{command}: {flag} is both {seen[flag]} and {action.dest}"
                seen[flag] = action.dest


def declaration(cls: type, name: str) -> str:
    """Where field ``name`` of the option class ``cls`` is declared: the class it was made from (a class of given
    settings: ``settings_of``, its ``prefix`` off the name), then the first class of its bases that declares the
    field (``TraceConfig.top_p`` is ``GenerationConfig.top_p``)."""
    origin = getattr(cls, "settings_of", None) or cls
    name = name.removeprefix(getattr(cls, "prefix", "") or "")
    owner = next(c for c in reversed(origin.__mro__) if name in c.__dict__.get("__annotations__", {}))
    return f"{owner.__module__}.{owner.__qualname__}.{name}"


def declarations() -> dict[str, dict[str, list[str]]]:
    """``flag -> declaration -> commands``, every command's parser enumerated."""
    found: dict[str, dict[str, list[str]]] = {}
    for command in COMMANDS:
        default = PARSER.parse_args([command, *required(command)])
        for action in options(command):
            owner, name = action.dest.rsplit(".", 1)
            where = declaration(type(_at(default, owner)), name)
            for flag in action.option_strings:
                found.setdefault(flag, {}).setdefault(where, []).append(command)
    return found


def test_each_flag_is_declared_once_across_commands():
    found = declarations()
    twice = {flag: where for flag, where in found.items() if len(where) > 1}
    assert twice == {}, "flags declared by two fields: " + "; ".join(
        f"{flag}: " + " | ".join(f"{w} ({', '.join(c)})" for w, c in where.items()) for flag, where in twice.items())
    shared = {flag: next(iter(where)) for flag, where in found.items() if sum(map(len, where.values())) > 1}
    assert shared["--arm-c"] == "lensprobe.interventions.arm.ARM.c"  # eval, reproduce and mechanism
    assert shared["--filler-count"].endswith("FillerCountOptions.filler_count")  # attention and mechanism
    assert shared["--limit"].endswith("LimitOptions.limit") and shared["--quick"].endswith("QuickOptions.quick")
    assert shared["--max-new-tokens"] == "lensprobe.generation.config.GenerationConfig.max_new_tokens"
    assert shared["--batch-size"] == "lensprobe.evals.running.config.EvalConfig.batch_size"
    assert set(found["--max-new-tokens"][shared["--max-new-tokens"]]) == {"eval", "trace", "reproduce", "sinks"}


@dataclass(frozen=True)
class _TwoMaxTokens:
    max_new_tokens: int = 3
    """tokens generated"""


def test_the_declaration_walk_tells_two_declarations_apart():
    from lensprobe.app.option_groups import RunSizeOptions
    from lensprobe.evals.running.settings import EvalSettings
    from lensprobe.studies.settings import TraceConfig

    same = {declaration(c, "max_new_tokens") for c in (EvalSettings, TraceConfig, RunSizeOptions)}
    assert same == {"lensprobe.generation.config.GenerationConfig.max_new_tokens"}
    assert declaration(_TwoMaxTokens, "max_new_tokens").endswith("_TwoMaxTokens.max_new_tokens")


def test_the_run_settings_of_reproduce_come_from_the_shared_options(capsys):
    from lensprobe.app.commands.reproduce import given_settings
    from lensprobe.app.recipe import ReproduceConfig

    args = PARSER.parse_args(["reproduce", "arm-table1", "--limit", "5", "--quick", "--max-new-tokens", "7",
                              "--batch-size", "2", "--runs", "3"])
    got = given_settings(args)
    assert got == ReproduceConfig(limit=5, quick=True, max_new_tokens=7, batch_size=2, runs=3)
    assert given_settings(PARSER.parse_args(["reproduce", "arm-table1"])).given() == {}  # the recipe's, then
    mech = PARSER.parse_args(["mechanism", "--question", "x", "--filler-count", "7", "--arm-c", "0.2"])
    assert (mech.FillerCountOptions.filler_count, mech.arm.arm_c) == (7, 0.2)
    att = PARSER.parse_args(["attention", "--question", "x", "--filler-count", "9"])
    assert att.FillerCountOptions.filler_count == 9 and not hasattr(att.filler_setup, "filler_count")
    assert PARSER.parse_args(["eval", "--limit", "4"]).LimitOptions.limit == 4
    assert PARSER.parse_args(["demo", "--quick"]).QuickOptions.quick is True
    for argv, flag in [(["reproduce", "x", "--batch-size", "0"], "--batch-size"),
                       (["mechanism", "--question", "x", "--filler-count", "0"], "--filler-count")]:
        assert main(argv) == 2
        assert f"{flag}: expected a whole number" in capsys.readouterr().err


@dataclass(frozen=True)
class _Prompt:
    system: str | None = None
    """the system prompt"""


@dataclass(frozen=True)
class _Conditions:
    system: str | None = None
    """replace every condition's system prompt"""


def test_two_groups_with_one_field_name_are_refused_when_the_parser_is_built():
    parser = new_parser(prog="test")
    add_config(parser, _Prompt, "sys")
    add_config(parser, _Conditions, "cond")
    with pytest.raises(ConflictResolutionError, match="--system"):
        parser._preprocessing()  # never --sys.system and --cond.system, one of them lost by a flat namespace


CANDIDATES = ("3", "L0H1", "w/ Mful", "0.5", "0.05", "x", "logit_diff", "aime2024=a.jsonl", "math500", "1,2", "false", "0", "pause", "first:2")


COMPANIONS = {"--n-samples": ["--sample"], "--tokens": ["--metric", "logit_diff"]}
"""What a flag needs beside it to be valid."""


def _at(args: argparse.Namespace, dest: str):
    value = args
    for part in dest.split("."):
        value = getattr(value, part)
    return value


def _given(command: str, action: argparse.Action, default: argparse.Namespace) -> list[str] | None:
    """A command line giving ``action`` a value that parses and lands on its field (differs from the default)."""
    flag = action.option_strings[0]
    for value in [*(action.choices or ()), *CANDIDATES, None]:
        argv = [command, *required(command), flag] + ([] if value is None else [str(value)])
        argv += COMPANIONS.get(flag, []) + (["--tokens", "7,8"] if value == "logit_diff" else [])
        try:
            args = PARSER.parse_args(argv)
        except (SystemExit, LensprobeError):
            continue
        if _at(args, action.dest) != _at(default, action.dest):
            return argv
    return None


def required(command: str) -> list[str]:
    """The options ``command`` cannot run without (its question, its report folder)."""
    needed = [a for a in COMMANDS[command]._actions if a.required]
    return ["--question", "x"] * any("--question" in a.option_strings for a in needed) + \
        ["runs"] * any(not a.option_strings for a in needed)


def test_every_flag_of_every_command_reaches_its_field(capsys):
    """Each option given lands on its own field of its own object (none is dropped or overwritten)."""
    checked = 0
    for command in COMMANDS:
        default = PARSER.parse_args([command, *required(command)])
        for action in options(command):
            assert "." in action.dest, (command, action.dest)  # a field of a configuration object
            assert _given(command, action, default) is not None, f"{command} {action.option_strings}: dropped"
            checked += 1
    capsys.readouterr()
    assert checked > 100


def test_settings_shared_by_commands_are_one_class_each():
    """--heads, --ablation, --metric, --system, --filler, --heads-per-forward, ... are each one dataclass that every
    command taking it adds."""
    owners: dict[str, set[str]] = {}
    for command in COMMANDS:
        for action in options(command):
            if "." in action.dest:
                owners.setdefault(action.option_strings[0], set()).add(action.dest.rsplit(".", 1)[0])
    for flag, owner in {"--heads": "HeadSelection", "--ablation": "AblationSettings", "--metric": "MetricSettings",
                        "--tokens": "MetricSettings", "--system": "SystemOptions", "--filler": "FillerOptions",
                        "--reference": "ReferenceOptions", "--model": "ModelOptions", "--out": "OutputOptions",
                        "--heads-per-forward": "AblationBatch", "--random-heads": "RecallCheck", "--grader": "GraderOptions",
                        "--question": "QuestionOptions", "--answer": "AnswerOptions", "--limit": "LimitOptions",
                        "--quick": "QuickOptions", "--filler-count": "FillerCountOptions", "--arm-c": "arm"}.items():
        assert owners[flag] == {owner}, (flag, owners[flag])


SAMPLE = {"--ablation": "mean", "--arm-c": "0.2", "--attribution": "atp*", "--n-samples": "2",
          "--benchmark-data": "aime2024=a.jsonl", "--fusion-alpha": "0.5", "--fusion-token": "<x>", "--filler-count": "7", "--filler-placement": "before_system",
          "--filler-seed": "3", "--arm-seed": "4", "--compare": "w/ Mful", "--show-tokens": "5",
          "--heads-per-forward": "4", "--random-heads": "2"}
"""A value for each flag a renamed one now is."""


@pytest.mark.parametrize(("command", "old"), sorted(RENAMED))
def test_a_renamed_flag_still_works_with_a_note_naming_the_new_one(command, old, capsys):
    new = RENAMED[(command, old)]
    flags = {s for a in options(command) for s in a.option_strings}
    assert new in flags and old not in flags  # hidden, and no flag of this command has its old spelling
    value = SAMPLE[new]
    base = [command, *required(command)] + (["--reference", "x"] if new == "--ablation" else []) + COMPANIONS.get(new, [])
    rewritten = renamed_flags([*base, old, value], list(COMMANDS))
    assert f"lensprobe: note: `{command} {old}` is now {new}" in capsys.readouterr().err
    assert rewritten == [*base, new, value]
    old_args, new_args = PARSER.parse_args(rewritten), PARSER.parse_args([*base, new, value])
    assert vars(old_args) == vars(new_args) != vars(PARSER.parse_args(base))
    assert renamed_flags([*base, f"{old}={value}"], list(COMMANDS)) == [*base, f"{new}={value}"]


def test_an_old_spelling_is_refused_where_it_was_never_a_flag(capsys):
    assert main(["eval", "--heads-per-forward", "4"]) == 2  # the sweep's setting: no meaning in eval
    assert "unrecognized arguments: --heads-per-forward" in capsys.readouterr().err
    assert main(["sweep", "--random-heads", "2"]) == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_ablate_needs_its_heads_named(tmp_path, capsys):
    """--heads is one declaration (every head by default); ablate, which has no sensible default, asks for it."""
    assert main(["ablate", "--model", "tiny", "--question", "x", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == ("lensprobe: error: ablate needs --heads: the heads to ablate, e.g. --heads "
                                       "L0H3,L1H2 (or all).\n")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["attention", "ablate", "mechanism", "trace"])
def test_a_command_of_one_question_refuses_a_second_rather_than_drop_one(command, tmp_path, capsys):
    argv = [command, "--model", "tiny", "--out", str(tmp_path / "o")] + (["--heads", "L0H1"] if command == "ablate" else [])
    assert main([*argv, "--question", "a", "--question", "b"]) == 2
    assert capsys.readouterr().err == (f"lensprobe: error: {command} runs one question, but --question was given 2 "
                                       f"times: give it once (run {command} once per question).\n")
    assert main(argv) == 2
    assert capsys.readouterr().err == f"lensprobe: error: {command} needs --question TEXT: the question it runs.\n"
    assert not (tmp_path / "o").exists()


def test_commands_read_their_settings_from_the_objects():
    args = PARSER.parse_args(["sweep", "--heads", "L0H1", "--ablation", "mean", "--reference", "r", "--system", "S"])
    assert not hasattr(args, "heads") and not hasattr(args, "system")  # no flat copy that a group could overwrite
    assert args.HeadSelection.heads == "L0H1" and args.AblationSettings.ablation == "mean"
    assert args.SystemOptions.system == "S"
    eval_args = PARSER.parse_args(["eval", "--system", "S"])
    assert eval_args.SystemOptions.system == "S"  # the same class as every other command's
    assert dataclasses.is_dataclass(eval_args.SystemOptions)


def test_a_flag_is_negated_by_one_no_and_the_negation_parses(capsys):
    """Bool options read ``--no-system`` (never ``--nono-system``) and ``--sample`` / ``--no-sample``, in the help
    and in the parser."""
    for command, sub in COMMANDS.items():
        strings = {s for a in sub._actions for s in a.option_strings}
        doubled = sorted(s for s in strings if s.startswith(("--nono", "--no-no")))
        assert doubled == [], f"{command}: {doubled}"
        with pytest.raises(SystemExit):
            PARSER.parse_args([command, "--help"])
        shown = capsys.readouterr().out
        assert "--nono" not in shown and "--no-no-" not in shown, command
    assert "--no-system" in COMMANDS["mechanism"].format_help()
    args = PARSER.parse_args(["mechanism", "--question", "x", "--no-system"])
    assert args.SystemOptions.no_system is True
    assert PARSER.parse_args(["mechanism", "--question", "x"]).SystemOptions.no_system is False
    assert PARSER.parse_args(["trace", "--question", "x", "--sample", "--no-sample"]).config.do_sample is False
    assert PARSER.parse_args(["trace", "--question", "x", "--sample"]).config.do_sample is True
    assert "--nosample" not in {s for a in COMMANDS["trace"]._actions for s in a.option_strings}
