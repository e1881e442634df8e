"""The ``lensprobe`` command.

Each subcommand lives in :mod:`lensprobe.app.commands` and is registered by an
``add_<name>(subparsers)`` function listed in :data:`SUBCOMMANDS`; it sets ``func`` to a
function ``(args) -> int`` that calls the library. Errors of lensprobe
(:class:`~lensprobe.core.errors.LensprobeError`) print one line on stderr and exit with
code 2; so does bad command-line input.

Examples:
    lensprobe attention --question "What is 12+7?" --filler meaningless --layers 0 --heads 0,1,7 --out attn
    lensprobe demo --out lensprobe-report
"""

import argparse
import sys
from collections.abc import Callable, Sequence

from lensprobe.app.commands.attention import add_attention
from lensprobe.app.commands.demo import add_demo
from lensprobe.app.commands.evals import add_eval, add_eval_report
from lensprobe.app.commands.heads import add_ablate, add_sweep
from lensprobe.app.commands.mechanism import add_mechanism
from lensprobe.app.commands.trace import add_trace
from lensprobe.core.errors import LensprobeError
from lensprobe.core.version import __version__

SUBCOMMANDS: list[Callable] = [add_attention, add_demo, add_eval, add_eval_report, add_trace, add_ablate, add_sweep,
                               add_mechanism]
"""Functions that register one subcommand each; add yours here."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lensprobe",
        description="Attention, entropy and intervention studies on TransformerLens models. "
                    "Layers and heads are 0-based (TransformerLens); papers count from 1.")
    parser.add_argument("--version", action="version", version=f"lensprobe {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lensprobe`` console script; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # bad arguments (code 2) or --help/--version (code 0)
        return int(exc.code or 0)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except LensprobeError as err:
        print(f"lensprobe: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lensprobe: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
