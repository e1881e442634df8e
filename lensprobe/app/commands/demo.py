"""``lensprobe demo``: every study on one model, written as one self-contained HTML report."""

from pathlib import Path

from lensprobe.app.common import TEST_MODEL, add_model_argument
from lensprobe.app.demo import run_demo
from lensprobe.core.testing import tiny_model


def add_demo(subparsers) -> None:
    """Register ``lensprobe demo``."""
    p = subparsers.add_parser("demo", help="write the demo report (embedded model, offline)",
                              description="Run every study on the embedded SmolLM2-135M-Instruct (or --model) "
                                          "and write a self-contained HTML report with the numbers as CSV/JSON.")
    p.add_argument("--out", type=Path, default=Path("lensprobe-report"), help="output folder (default lensprobe-report)")
    add_model_argument(p)
    p.add_argument("--quick", action="store_true", help="tiny inputs: a fast smoke run")
    p.set_defaults(func=run_demo_command)


def run_demo_command(args) -> int:
    """Write the report; ``--model tiny`` is the tiny test model, anything else loads in :func:`run_demo`."""
    model = tiny_model(seed=0) if args.model == TEST_MODEL else args.model
    index = run_demo(args.out, model, quick=args.quick)
    print(f"report written to {index.resolve()}")
    return 0
