"""Hostile input at every public entry point: each public function (enumerated from the public API) and each
command (enumerated from the command's parser) gets values of every hostile family its parameters take
(tests/hostile.py) and must end in a result or one LensprobeError (a command: success, or one error line on
stderr and a non-zero exit), never a hang, a raw traceback or a file written outside its folder. A new
function or command is covered the day it is added; docs/cli.md's "Hostile input" states the counts."""

import re
import warnings
from pathlib import Path

import pytest
from hostile import (
    CLI_VALUES,
    FAMILIES,
    Hung,
    kind,
    materialise,
    option_kind,
    parameters,
    public_functions,
    sandbox_run,
    subparsers,
    targets,
    time_limit,
    values,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lensprobe as lp
from lensprobe.app import cli

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
SKIP = {
    "lp.reproduce": "runs a paper's whole recipe (hundreds of generations) whenever the recipe given is valid",
}
"""Public functions left out, each needing a real long computation; the reason says which."""
CLI_SKIP = {
    "demo": "draws the whole demo report (every figure) whenever its options are valid",
}
"""Commands left out, for the same reason."""
EXAMPLES = {"paths": 2, "text": 2, "numbers": 2, "types": 1, "nesting": 1}
"""Hypothesis examples per public function and family."""
CLI_EXAMPLES = {"paths": 2, "text": 2, "numbers": 2, "types": 1, "nesting": 1}
"""Hypothesis examples per command and family."""
FUNCTIONS = public_functions()
PARSER = cli.build_parser()
COMMANDS = subparsers(PARSER)
CASES = [(path, family) for path in FUNCTIONS if path not in SKIP for family in FAMILIES
         if targets(FUNCTIONS[path], family)]
BASE = {"--model": "tiny", "--question": "What is 2+3?", "--limit": "1", "--max-new-tokens": "2", "--out": "out",
        "--heads": "L0H1", "ReportOptions.dirs": "folder", "RecipeOptions.recipe": "arm-table1"}
"""Each command's valid options, so that a call the hostile value does not stop stays small."""


def hostile_options(command: str, family: str) -> list:
    """The options of ``command`` (those taking a value) that ``family`` attacks."""
    wanted = {"paths": {"path"}, "text": {"text"}, "numbers": {"number"}}.get(family)
    return [a for a in COMMANDS[command]._actions if a.dest not in ("help", "debug") and a.nargs != 0
            and (wanted is None or option_kind(a) in wanted)]


CLI_CASES = [(c, f) for c in COMMANDS if c not in CLI_SKIP for f in FAMILIES if hostile_options(c, f)]
SETTINGS = {"derandomize": True, "deadline": None, "database": None, "suppress_health_check": list(HealthCheck)}


@pytest.fixture(scope="module")
def model():
    """The harness's own tiny random model (a call may add a token to it)."""
    from lensprobe.core.models.testing import tiny_model

    return tiny_model(seed=0)


def neutral(fn, p, model, box: Path):
    """A plain value for a parameter the call does not attack (required, or naming the model)."""
    return {"model": model, "path": box / "in.jsonl", "text": "What is 2+3?", "number": 1}.get(
        kind(p.name, p.annotation, fn.__name__))


@pytest.mark.unchecked  # what a user without a type checker sees
@pytest.mark.parametrize("path, family", CASES, ids=[f"{p}-{f}" for p, f in CASES])
def test_a_public_function_ends_in_a_result_or_one_lensprobe_error(path, family, model, tmp_path, monkeypatch):
    fn = FUNCTIONS[path]

    @settings(max_examples=EXAMPLES[family], **SETTINGS)
    @given(target=st.sampled_from(targets(fn, family)), data=st.data())
    def check(target, data):
        params = parameters(fn)
        attacked = next(p for p in params if p.name == target)
        value = data.draw(values(family, kind(attacked.name, attacked.annotation, fn.__name__)), label=target)
        with sandbox_run(tmp_path, monkeypatch) as box:
            given_ = {p.name: neutral(fn, p, model, box) for p in params
                      if p.default is p.empty or kind(p.name, p.annotation, fn.__name__) == "model"}
            given_[target] = materialise(value, box)
            positional = [given_.pop(p.name) for p in params if p.kind == p.POSITIONAL_ONLY and p.name in given_]
            try:
                with time_limit(path), warnings.catch_warnings(record=True):  # a warning is an outcome: kept, not raised
                    warnings.simplefilter("always")
                    fn(*positional, **given_)
            except lp.LensprobeError as err:
                assert not isinstance(err.__cause__, AssertionError), f"{path}: {err}"  # e.g. the real model
            except Hung as err:
                pytest.fail(str(err))

    check()


def cli_argv(command: str, action, value: str) -> list[str]:
    """``command`` with its valid :data:`BASE` options, then the hostile one."""
    flags = {s for a in COMMANDS[command]._actions for s in a.option_strings}
    argv = [command]
    for flag, given_ in BASE.items():
        if flag in flags and flag not in action.option_strings:
            argv += [flag, given_]
    positional = [a.dest for a in COMMANDS[command]._actions if not a.option_strings and a.dest in BASE]
    argv += [BASE[d] for d in positional if d != action.dest]
    return argv + [*action.option_strings[-1:], value]


@pytest.mark.parametrize("command, family", CLI_CASES, ids=[f"{c}-{f}" for c, f in CLI_CASES])
def test_a_command_ends_in_success_or_one_error_line(command, family, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "build_parser", lambda: PARSER)  # built once: the harness calls main() many times

    @settings(max_examples=CLI_EXAMPLES[family], **SETTINGS)
    @given(action=st.sampled_from(hostile_options(command, family)), value=CLI_VALUES[family])
    def check(action, value):
        with sandbox_run(tmp_path, monkeypatch) as box:
            text = str(materialise(value, box))
            argv = cli_argv(command, action, text)
            try:
                with time_limit(" ".join(argv)), warnings.catch_warnings(record=True):  # a warning is an outcome: kept, not raised
                    warnings.simplefilter("always")
                    code = cli.main(argv)
            except Hung as err:
                pytest.fail(str(err))
            err = capsys.readouterr().err
            assert "Traceback" not in err, argv
            if code != 0:
                lines = [line for line in err.splitlines() if re.match(r"^lensprobe[\w -]*: (unexpected )?error", line)]
                assert len(lines) == 1, (argv, err[-2000:])

    check()


def test_the_skip_lists_name_what_exists():
    assert set(SKIP) <= set(FUNCTIONS), sorted(set(SKIP) - set(FUNCTIONS))
    assert set(CLI_SKIP) <= set(COMMANDS), sorted(set(CLI_SKIP) - set(COMMANDS))
    assert all(len(reason) > 20 for reason in [*SKIP.values(), *CLI_SKIP.values()])


def test_the_docs_state_the_harness_as_it_is():
    doc = DOC.read_text(encoding="utf-8")
    section = doc[doc.index("## Hostile input"):]
    numbers = {
        "public functions": len(FUNCTIONS) - len(SKIP), "commands": len(COMMANDS) - len(CLI_SKIP),
        "function cases": len(CASES), "command cases": len(CLI_CASES),
        **{f"{f} examples per function": n for f, n in EXAMPLES.items()},
        **{f"{f} examples per command": n for f, n in CLI_EXAMPLES.items()},
    }
    stated = {}
    for key in numbers:
        found = re.search(r"\*\*(\d+)\*\*\s+" + r"\s+".join(key.split()) + r"\b", section)
        stated[key] = int(found.group(1)) if found else None
    assert stated == numbers
    for name in [*SKIP, *CLI_SKIP]:
        assert f"`{name}`" in section, f"docs/cli.md's Hostile input does not name the skipped {name}"
