"""``lensprobe reproduce``: run a study recipe (a paper's table or figure) with the published numbers beside.

Examples:
    lensprobe reproduce --list
    lensprobe reproduce arm-table1 --limit 5 --out repro/table1
    lensprobe reproduce arm-table2 --model Qwen/Qwen2.5-Math-1.5B --dtype bf16 --data aime2024=aime_2022_2024.jsonl --out repro/t2
    lensprobe reproduce my-recipe.toml --model tiny --out repro/mine
"""

from pathlib import Path

from lensprobe.app.checks import check_common, positive_int
from lensprobe.app.commands.armargs import add_arm_arguments, arm_from_args
from lensprobe.app.common import add_model_argument, check_out_dir, load_cli_model, writing_out_dir
from lensprobe.app.option_groups import EVAL_OPTIONS, OutputOptions
from lensprobe.app.options import Option, add_options
from lensprobe.app.recipe import list_recipes, load_recipe
from lensprobe.app.reproduce import reproduce
from lensprobe.app.reproduce_tables import markdown_table
from lensprobe.core.errors import LensprobeError
from lensprobe.evals.config import EvalConfig
from lensprobe.interventions.arm_presets import benchmark_key


def add_reproduce(subparsers) -> None:
    """Register ``lensprobe reproduce``."""
    p = subparsers.add_parser(
        "reproduce", help="run a paper's table or figure as a recipe, the published numbers beside",
        description="Run a study recipe (lensprobe reproduce --list; or your own .toml file) and write its table "
                    "(CSV + Markdown + report page) with the paper's published numbers in columns beside the run's. "
                    "Evaluation rows are kept under OUT/runs, so a rerun resumes.")
    p.add_argument("recipe", nargs="?", default=None, help="recipe name or .toml file")
    p.add_argument("--list", action="store_true", help="list the shipped recipes and exit")
    add_model_argument(p)
    p.add_argument("--limit", type=positive_int, default=None, help="at most this many problems per benchmark")
    add_options(p, EvalConfig, {name: EVAL_OPTIONS[name] for name in ("max_new_tokens", "batch_size")},
                max_new_tokens=Option(default=None, help="generated tokens per answer (default: the protocol's, 2048 "
                                                         "for arm-math500)"))
    p.add_argument("--data", action="append", default=[], metavar="BENCHMARK=FILE",
                   help="problem file of a benchmark lensprobe does not ship, e.g. aime2024=aime_2022_2024.jsonl "
                        "(repeatable); benchmarks without data are skipped with a note")
    p.add_argument("--quick", action="store_true", help="figure recipes: short inputs (a smoke run)")
    add_arm_arguments(p)
    add_options(p, OutputOptions, out=Option(help="output folder (default: reproduce-<recipe>)"),
                no_progress=Option(help="no progress bars"))
    p.set_defaults(func=run_reproduce, interrupted="evaluation rows are saved in OUT/runs; rerun the same command "
                                                   "to resume")


def data_from_args(values: list[str]) -> dict[str, Path]:
    """``["aime2024=file.jsonl"]`` -> ``{"aime2024": Path("file.jsonl")}`` (names checked, files must exist)."""
    data = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not path:
            raise LensprobeError(f"--data takes BENCHMARK=FILE (e.g. aime2024=aime_2022_2024.jsonl), got {value!r}.")
        if not Path(path).expanduser().is_file():
            raise LensprobeError(f"--data {value}: {path} does not exist.")
        data[benchmark_key(name)] = Path(path).expanduser()
    return data


def _list_text() -> str:
    rows = [(r.name, r.kind, f"arXiv {r.arxiv}" + (f" Table {r.table}" if r.table else ""), r.title)
            for r in list_recipes()]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{n:<{width}}  {k:<6}  {src:<24}  {title}" for n, k, src, title in rows)


def run_reproduce(args) -> int:
    if args.list:
        print(_list_text())
        return 0
    if args.recipe is None:
        raise LensprobeError("name a recipe (lensprobe reproduce --list shows them) or give a .toml file.")
    check_common(args)  # every argument is checked before the model loads
    recipe = load_recipe(args.recipe)
    data = data_from_args(args.data)
    out = args.out if args.out is not None else Path(f"reproduce-{recipe.name}")
    check_out_dir(out, "reproduce")
    with writing_out_dir(out, "reproduce") as files:
        return _reproduce(args, recipe, data, out, files)


def _reproduce(args, recipe, data: dict[str, Path], out: Path, files: list[Path]) -> int:
    benches = recipe.benchmarks or (None,)
    for bench in benches:  # a partial --arm-* setting without a preset fails here
        arm_from_args(args, benchmark=bench)
    model = load_cli_model(args)
    arms = {b: arm_from_args(args, model, b) for b in benches if b is not None}  # None: the preset
    res = reproduce(recipe, model, out=out, limit=args.limit, max_new_tokens=args.max_new_tokens, data=data,
                    arm={b: a for b, a in arms.items() if a is not None} or None, quick=args.quick, batch_size=args.batch_size, progress=not args.no_progress)
    if res.table is not None:
        print(markdown_table(res.table))
    for note in res.notes:
        print(f"note: {note}")
    files += res.files.values()  # the evaluation rows under OUT/runs are kept by the store
    for name, path in res.files.items():
        print(f"{name}: {path.resolve()}")
    return 0
