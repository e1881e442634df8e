"""The ``lensprobe`` command.

Each subcommand lives in :mod:`lensprobe.app.commands` and is registered by an
``add_<name>(subparsers)`` function listed in :data:`SUBCOMMANDS`; it sets ``func`` to a
function ``(args) -> int`` that calls the library. Errors of lensprobe
(:class:`~lensprobe.core.errors.LensprobeError`) and operating-system errors on files (a full
disk, a folder without write permission) print one line on stderr and exit with code 2; so
does bad command-line input. Any other exception is a bug: one line names it and the log file
holding its traceback (exit code 1); ``--debug`` (or the environment variable ``LENSPROBE_DEBUG=1``)
prints tracebacks instead.

The options of each subcommand are read from its configuration dataclasses by simple-parsing
(:mod:`lensprobe.app.parsing`); a configuration's ``__post_init__`` checks the values while the command
line is parsed, and its error names the option. Every subcommand's ``--help`` ends with an example
(:mod:`lensprobe.app.examples`); ``lensprobe --help`` lists the subcommands by study.

Examples:
    lensprobe attention --question "What is 12+7?" --compare "w/ Mless" --layers 0 --heads L0H1,L0H3 --out attn
    lensprobe demo --out lensprobe-report
"""

import argparse
import datetime
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from lensprobe.app.checks import check_common
from lensprobe.app.commands.attention import add_attention
from lensprobe.app.commands.attribution import add_attribute, add_find_heads
from lensprobe.app.commands.demo import add_demo
from lensprobe.app.commands.evals import add_eval, add_eval_report
from lensprobe.app.commands.heads import add_ablate, add_sweep
from lensprobe.app.commands.mechanism import add_mechanism
from lensprobe.app.commands.patching import add_patch_heads
from lensprobe.app.commands.reproduce import add_reproduce
from lensprobe.app.commands.sinks import add_sinks
from lensprobe.app.commands.trace import add_trace
from lensprobe.app.examples import studies_text
from lensprobe.app.parsing import ConfigParser, renamed_flags, setting_message
from lensprobe.core.errors import LensprobeError
from lensprobe.core.models.loading import cache_dir
from lensprobe.core.storage.writer import OutputFolder
from lensprobe.core.version import __version__

SUBCOMMANDS: list[Callable] = [add_attention, add_demo, add_eval, add_eval_report, add_trace, add_ablate, add_sweep,
                               add_attribute, add_find_heads, add_patch_heads, add_mechanism, add_sinks, add_reproduce]
"""Functions that register one subcommand each; add yours here."""


class OneLineErrorParser(ConfigParser):
    """An argument parser (:class:`~lensprobe.app.parsing.ConfigParser`) whose usage errors are one line
    (with where to find the usage), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="lensprobe",
        description="Attention, entropy and intervention studies on TransformerLens models. "
                    "Layers and heads are 0-based (TransformerLens); papers count from 1.")
    parser.add_argument("--version", action="version", version=f"lensprobe {__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands",
                                       description="run `lensprobe COMMAND --help` for a command's options")
    for add in SUBCOMMANDS:
        add(subparsers)
    for sub in subparsers.choices.values():  # also accepted after the command's name
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
        sub._preprocessing()  # simple-parsing adds the fields' options now, not at the first parse
    helps = {a.dest: a.help or "" for a in subparsers._choices_actions}
    subparsers._choices_actions = []  # listed by study instead, below
    parser.epilog = studies_text(helps)
    return parser


DEBUG_HELP = ("print the full traceback of an error (by default: one line, and unexpected errors are logged; "
              "also LENSPROBE_DEBUG=1)")


def subcommand_names(parser: argparse.ArgumentParser) -> list[str]:
    """The subcommands' names."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def option_strings(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """The option strings of the subcommand ``argv`` names (none: the top parser's)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = next((sub.choices[a] for a in argv if a in sub.choices), parser)
    return [s for a in command._actions for s in a.option_strings]


def write_error_log(command: str, text: str) -> Path:
    """Save a traceback in ``<cache dir>/logs/`` (else the temporary folder) and return the file's path."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for folder in (cache_dir() / "logs", Path(tempfile.gettempdir())):
        try:
            # errors="replace": a command or traceback holding undecodable bytes still makes a whole log
            log = f"lensprobe {__version__}: {command}\n\n{text}".encode("utf-8", errors="replace")
            return OutputFolder(folder, what="log folder").write_bytes(f"lensprobe-error-{stamp}-{os.getpid()}.log", log)
        except (OSError, LensprobeError):
            continue
    raise OSError("no folder to write the error log in")


def one_line(message: str) -> str:
    """A message of several lines (e.g. a list of differences) as one line: ``"a:\n  b\n  c" -> "a: b; c"``."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return " ".join(lines[:1] + ["; ".join(lines[1:])] if len(lines) > 1 else lines)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _os_error_line(err: OSError) -> str:
    where = f" {err.filename}" if err.filename else ""
    return (f"cannot use{where}: {err.strerror or _first_line(err)}. Check the path, its permissions and the free "
            "disk space.")


DEBUG_VAR = "LENSPROBE_DEBUG"
"""Environment variable: ``1`` prints full tracebacks, as ``--debug`` does."""


def debug_wanted(argv: Sequence[str], args: argparse.Namespace | None = None) -> bool:
    """``--debug`` given (parsed, or seen in ``argv`` when parsing failed) or ``LENSPROBE_DEBUG=1``."""
    given = bool(getattr(args, "debug", False)) if args is not None else "--debug" in argv
    return given or os.environ.get(DEBUG_VAR, "").strip().lower() in ("1", "true", "yes")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lensprobe`` console script; returns the exit code."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(renamed_flags(argv, subcommand_names(parser)))
    except SystemExit as exc:  # bad arguments (code 2) or --help/--version (code 0)
        return int(exc.code or 0) if isinstance(exc.code, int) or exc.code is None else 2
    except LensprobeError as err:  # a configuration refused a value while the command line was read
        if debug_wanted(argv):
            traceback.print_exc()
        print(f"lensprobe: error: {one_line(setting_message(err, option_strings(parser, argv)))}", file=sys.stderr)
        return 2
    except Exception as err:  # a bug while the command line was read
        return _unexpected(err, argv, debug_wanted(argv))
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    debug = debug_wanted(argv, args)
    try:
        check_common(args)  # text, --device, --system: before any model loads
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        hint = getattr(args, "interrupted", None)
        print(f"lensprobe: interrupted{'; ' + hint if hint else ''}", file=sys.stderr)
        return 130
    except (LensprobeError, OSError) as err:  # the user's to fix: one line
        if debug:
            traceback.print_exc()
        line = one_line(str(err)) if isinstance(err, LensprobeError) else _os_error_line(err)
        print(f"lensprobe: error: {line}", file=sys.stderr)
        return 2
    except Exception as err:  # a bug: one line and a log of the traceback
        return _unexpected(err, argv, debug)


def _unexpected(err: Exception, argv: Sequence[str], debug: bool) -> int:
    """An exception lensprobe did not foresee: one line naming it and where its traceback is (exit code 1)."""
    if debug:
        traceback.print_exc()
        print(f"lensprobe: unexpected error: {type(err).__name__}: {_first_line(err)}", file=sys.stderr)
        return 1
    try:
        log = f"the traceback is in {write_error_log(' '.join(['lensprobe', *argv]), traceback.format_exc())}"
    except (OSError, LensprobeError):
        log = "no log could be written"
    print(f"lensprobe: unexpected error: {type(err).__name__}: {one_line(_first_line(err))} ({log}; rerun with "
          f"--debug or {DEBUG_VAR}=1 to print it, and please report it)", file=sys.stderr)
    return 1

if __name__ == "__main__":
    sys.exit(main())
