"""The command line is its guide: docs/cli.md's table of options by command and its sentences about which commands
take an option are checked against each command's real parser, both ways; switches show as ``--x/--no-x``; ``trace``
takes ``--filler``; ``--math500`` problems bring their answers to ``--metric logprob``."""

import argparse
import json
import re
from pathlib import Path

import pytest

from lensprobe.app.cli import build_parser, main
from lensprobe.app.parsing import Flag, switch_spelling

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "cli.md"
PARSER = build_parser()
COMMANDS: dict[str, argparse.ArgumentParser] = next(
    a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices
EVERYWHERE = {"-h", "--help", "--debug"}
"""Options every command takes, said once above the table."""


def spellings(command: str) -> set[str]:
    """The options of ``command`` as the guide writes them: a switch with its negation (``--sample/--no-sample``),
    any other option by each of its strings."""
    out: set[str] = set()
    for action in COMMANDS[command]._actions:
        if not set(action.option_strings) - EVERYWHERE:
            continue
        if isinstance(action, Flag):
            out |= {s.strip() for s in switch_spelling(action).split(",")}
        else:
            out |= set(action.option_strings)
    return out


def flags_of(command: str) -> set[str]:
    """Every option string ``command`` accepts (both halves of a switch)."""
    return {s for spelled in spellings(command) for s in spelled.split("/")}


def positionals(command: str) -> list[str]:
    return [str(a.metavar or a.dest) for a in COMMANDS[command]._actions if not a.option_strings]


CODE = re.compile(r"`([^`]+)`")


def guide_table(text: str) -> dict[str, tuple[list[str], list[str]]]:
    """docs/cli.md's options table: command -> (arguments, options)."""
    body = text.split("<!-- options table (tests/app/test_cli_guide.py) -->", 1)[1]
    body = body.split("<!-- end of options table -->", 1)[0]
    rows = [line for line in body.strip().splitlines() if line.startswith("| `")]
    table = {}
    for row in rows:
        command, arguments, options = (cell.strip() for cell in row.strip().strip("|").split("|"))
        name = CODE.fullmatch(command).group(1)
        assert name not in table, f"{name} has two rows"
        table[name] = (CODE.findall(arguments), CODE.findall(options))
    return table


def test_the_table_lists_every_command_and_only_commands():
    table = guide_table(GUIDE.read_text(encoding="utf-8"))
    assert set(table) == set(COMMANDS), ("commands without a row: " + str(sorted(set(COMMANDS) - set(table))) +
                                         "; rows of no command: " + str(sorted(set(table) - set(COMMANDS))))


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_table_row_is_the_commands_parser_both_ways(command):
    arguments, options = guide_table(GUIDE.read_text(encoding="utf-8"))[command]
    assert len(options) == len(set(options)), f"{command}: an option listed twice"
    listed, real = set(options), spellings(command)
    assert listed - real == set(), f"{command}: the guide lists options the command does not take"
    assert real - listed == set(), f"{command}: options the guide does not list"
    assert arguments == positionals(command)


def test_the_table_check_fails_on_a_missing_or_extra_option():
    text = GUIDE.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `trace` |"))
    for broken in (row.replace("`--filler`, ", ""), row.replace(" |\n", "").rstrip(" |") + ", `--compare` |"):
        options = set(guide_table(text.replace(row, broken))["trace"][1])
        assert options != spellings("trace")


FLAGS = r"((?:`--[a-z0-9-]+`(?:, | and |, and )?)+)"
NAMES = r"((?:`[a-z0-9-]+`(?:, | and |, and )?)+)"
EVERY = re.compile(r"[Ee]very\s+command\s+takes\s+" + FLAGS)
EVERY_BUT = re.compile(r"[Ee]very\s+command\s+(?:but|except)\s+" + NAMES + r"\s+takes\s+" + FLAGS)
ONLY = re.compile(r"[Oo]nly\s+" + NAMES + r"\s+takes?\s+" + FLAGS)


def claims(text: str) -> list[tuple[str, set[str], set[str]]]:
    """The sentences saying which commands take an option: ``(sentence, the commands said to take them, the
    options)``. "Only A and B take X" also says no other command does (checked by the caller)."""
    text = " ".join(text.split())  # a sentence may wrap
    found = []
    for m in EVERY.finditer(text):
        found.append((m.group(0), set(COMMANDS), set(CODE.findall(m.group(1)))))
    for m in EVERY_BUT.finditer(text):
        found.append((m.group(0), set(COMMANDS) - set(CODE.findall(m.group(1))), set(CODE.findall(m.group(2)))))
    for m in ONLY.finditer(text):
        found.append(("only: " + m.group(0), set(CODE.findall(m.group(1))), set(CODE.findall(m.group(2)))))
    return found


def guide_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_sentences_of_the_docs_about_options_hold():
    checked = 0
    for page in guide_pages():
        for sentence, commands, options in claims(page.read_text(encoding="utf-8")):
            assert commands <= set(COMMANDS), f"{page.name}: {sentence!r} names no command {commands - set(COMMANDS)}"
            for option in options:
                taking = {c for c in COMMANDS if option in flags_of(c)}
                if sentence.startswith("only: "):
                    assert taking == commands, f"{page.name}: {sentence!r}: {option} is taken by {sorted(taking)}"
                else:
                    assert commands <= taking, f"{page.name}: {sentence!r}: {sorted(commands - taking)} lack {option}"
                checked += 1
    assert checked >= 15  # the guide's sentences were found (17 when written)


def test_a_false_sentence_is_caught():
    for sentence in ("Every command takes `--filler`.", "Only `ablate` and `sweep` take `--filler`.",
                     "Every command but `demo` takes `--model`."):
        ((_, commands, options),) = claims(sentence)
        (option,) = options
        taking = {c for c in COMMANDS if option in flags_of(c)}
        assert (taking != commands) if "Only" in sentence else not commands <= taking


def test_trace_takes_filler_as_the_guide_says():
    assert "--filler" in flags_of("trace")
    assert PARSER.parse_args(["trace", "--question", "x", "--filler", "meaningless"]).FillerOptions.filler == "w/ Mless"


def test_switches_show_with_their_negation_in_the_help(capsys):
    shown_switches = 0
    for command, sub in COMMANDS.items():
        with pytest.raises(SystemExit):
            PARSER.parse_args([command, "--help"])
        shown = capsys.readouterr().out
        assert not re.search(r"--no(?!-)[a-z]", shown), command  # never --nono-system, --nodo-sample
        assert not re.search(r"--[a-z-]+ ,", shown), command  # never "--sample , --do-sample ,"
        for action in sub._actions:
            if isinstance(action, Flag) and action.negative_option_strings:
                assert re.search(rf"^  {re.escape(switch_spelling(action))}", shown, re.M), (command, action.dest)
                shown_switches += 1
    assert shown_switches >= 6
    assert switch_spelling(next(a for a in COMMANDS["trace"]._actions if "--sample" in a.option_strings)) == \
        "--sample/--no-sample, --do-sample/--no-do-sample"
    assert switch_spelling(next(a for a in COMMANDS["trace"]._actions if "--no-system" in a.option_strings)) == \
        "--no-system"


def test_a_setting_not_given_stays_unset_and_its_switch_sets_either_way():
    """eval's --sample is the protocol's unless given: ``--sample`` True, ``--no-sample`` False, absent None."""
    settings = [PARSER.parse_args(["eval", *argv]).settings for argv in ([], ["--sample"], ["--no-sample"])]
    assert [s.do_sample for s in settings] == [None, True, False]
    assert PARSER.parse_args(["eval", "--no-stop-at-eos"]).settings.stop_at_eos is False
    assert [PARSER.parse_args(["reproduce", "x", *argv]).QuickOptions.quick for argv in ([], ["--quick"], ["--no-quick"])
            ] == [None, True, False]


def test_trace_builds_its_prompt_under_the_filler(tmp_path):
    import lensprobe as lp
    from lensprobe.core.models.testing import tiny_model
    from lensprobe.generation.traces.trace import load_trace

    question = "What is 2+3?"
    lengths = {}
    for filler in ("w/o", "w/ Mless"):
        out = tmp_path / filler.replace("/", "").replace(" ", "")
        argv = ["trace", "--model", "tiny", "--question", question, "--think", "none", "--max-new-tokens", "3",
                "--format", "json", "--no-progress", "--out", str(out)]
        assert main([*argv, "--filler", filler]) == 0
        trace = load_trace(out / "trace-no-thinking.json")
        lengths[filler] = int(trace.prompt_lengths[0])
        assert ("filler" in trace.tracked) == (filler != "w/o")
    tiny = tiny_model()
    plain = lp.build_prompt(tiny, question, system=lp.MATH_SYSTEM_PROMPT)
    filled = lp.build_prompt(tiny, question, system=lp.MATH_SYSTEM_PROMPT, filler=lp.Filler.meaningless())
    assert lengths == {"w/o": len(plain.tokens[0]), "w/ Mless": len(filled.tokens[0])}


def _short_math500(tmp_path, monkeypatch) -> Path:
    """A MATH-500 file of short problems the tiny model's context holds (``$LENSPROBE_MATH500``)."""
    rows = [{"problem": f"What is {a}+{b}?", "answer": str(a + b), "unique_id": f"test/{a}.json",
             "subject": "Algebra", "level": 1} for a, b in ((2, 3), (4, 5), (6, 1), (7, 7))]
    path = tmp_path / "math500.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    monkeypatch.setenv("LENSPROBE_MATH500", str(path))
    return path


def test_find_heads_with_math500_scores_each_problems_own_answer(tmp_path, monkeypatch):
    import lensprobe.app.commands.attribution as attribution
    from lensprobe.evals.problems.load import load_math500

    _short_math500(tmp_path, monkeypatch)
    seen = {}
    real = attribution.find_heads

    def spy(model, prompts, metric, **kwargs):
        seen.update(prompts=prompts, metric=metric, answers=kwargs["answers"])
        return real(model, prompts, metric, **kwargs)

    monkeypatch.setattr(attribution, "find_heads", spy)
    out = tmp_path / "heads"
    assert main(["find-heads", "--model", "tiny", "--math500", "2", "--metric", "logprob", "--top", "2",
                 "--random-heads", "0", "--no-progress", "--out", str(out)]) == 0
    problems = load_math500(limit=2, seed=0)
    assert seen["metric"] == "logprob" and seen["answers"] == [p.answer for p in problems]
    assert [p.pieces["question"] for p in seen["prompts"]] == [p.problem for p in problems]
    assert json.loads((out / "find_heads.json").read_text())["metric"] == "answer log-prob"


@pytest.mark.parametrize("command", ["find-heads", "attribute"])
def test_math500_with_an_answer_too_is_refused_before_the_model_loads(command, tmp_path, monkeypatch, capsys):
    _short_math500(tmp_path, monkeypatch)
    out = tmp_path / "o"
    assert main([command, "--model", "missing.gguf", "--math500", "2", "--metric", "logprob", "--answer", "5",
                 "--out", str(out)]) == 2
    assert "--math500 problems carry their answers" in capsys.readouterr().err
    assert main([command, "--model", "missing.gguf", "--metric", "logprob", "--question", "x", "--out", str(out)]) == 2
    assert "needs --answer TEXT" in capsys.readouterr().err
    assert not out.exists()
