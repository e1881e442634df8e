"""``lensprobe demo``: every study on one model, written as one self-contained HTML report."""

from pathlib import Path

from lensprobe.app.common import add_inputs, check_out_dir, load_cli_model, writing_out_dir
from lensprobe.app.demo import report_contents, run_demo
from lensprobe.app.examples import describe
from lensprobe.app.option_groups import ModelOptions, OutputOptions, QuickOptions


def add_demo(subparsers) -> None:
    """Register ``lensprobe demo``."""
    p = subparsers.add_parser("demo", **describe(
        "demo", help="write the demo report (embedded model, offline)",
        description="Run every study on the embedded SmolLM2-135M-Instruct (or --model) and write a "
                    "self-contained HTML report with the numbers as CSV/JSON (default --out: lensprobe-report)."))
    add_inputs(p, ModelOptions, QuickOptions, OutputOptions)
    p.set_defaults(func=run_demo_command)


def run_demo_command(args) -> int:
    """Load ``--model`` (``tiny``: the tiny test model) on ``--device`` in ``--dtype``, then write the report."""
    given = args.OutputOptions.out
    out = check_out_dir(given if given is not None else Path("lensprobe-report"), "report")  # before the model
    with writing_out_dir(out, "demo", pages=False):  # the report page lists its own files
        index = run_demo(out, load_cli_model(args), quick=bool(args.QuickOptions.quick))
    print(report_contents(index))
    return 0
