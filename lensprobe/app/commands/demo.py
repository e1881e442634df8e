"""``lensprobe demo``: every study on one model, written as one self-contained HTML report."""

from pathlib import Path

from lensprobe.app.common import add_model_argument, check_out_dir, load_cli_model, writing_out_dir
from lensprobe.app.demo import run_demo
from lensprobe.app.option_groups import OutputOptions
from lensprobe.app.options import Option, add_options


def add_demo(subparsers) -> None:
    """Register ``lensprobe demo``."""
    p = subparsers.add_parser("demo", help="write the demo report (embedded model, offline)",
                              description="Run every study on the embedded SmolLM2-135M-Instruct (or --model) "
                                          "and write a self-contained HTML report with the numbers as CSV/JSON.")
    add_options(p, OutputOptions, ["out"], out=Option(default=Path("lensprobe-report")))
    add_model_argument(p)
    p.add_argument("--quick", action="store_true", help="tiny inputs: a fast smoke run")
    p.set_defaults(func=run_demo_command)


def run_demo_command(args) -> int:
    """Load ``--model`` (``tiny``: the tiny test model) on ``--device`` in ``--dtype``, then write the report."""
    check_out_dir(args.out, "report")  # before the model loads
    with writing_out_dir(args.out, "demo", pages=False):  # the report page lists its own files
        index = run_demo(args.out, load_cli_model(args), quick=args.quick)
    print(f"report written to {index.resolve()}")
    return 0
