"""``lensprobe reproduce``: run a study recipe (a paper's table or figure) with the published numbers beside.

Examples:
    lensprobe reproduce --list
    lensprobe reproduce arm-table1 --limit 5 --out repro/table1
    lensprobe reproduce arm-table2 --model Qwen/Qwen2.5-Math-1.5B --dtype bf16 --benchmark-data aime2024=aime_2022_2024.jsonl --out repro/t2
    lensprobe reproduce my-recipe.toml --model tiny --out repro/mine
"""

from dataclasses import replace
from pathlib import Path

from lensprobe.app.checks import check_common
from lensprobe.app.common import add_inputs, check_out_dir, load_cli_model, writing_out_dir
from lensprobe.app.examples import describe
from lensprobe.app.option_groups import (
    LimitOptions,
    ModelOptions,
    OutputOptions,
    QuickOptions,
    RecipeOptions,
    RunSizeOptions,
)
from lensprobe.app.parsing import add_config
from lensprobe.app.recipe import ReproduceConfig, list_recipes, load_recipe
from lensprobe.app.reproduce import check_reproduce, reproduce
from lensprobe.app.reproduce_tables import markdown_table
from lensprobe.core.errors import LensprobeError, SettingError
from lensprobe.evals.running.protocols import arm_layer_defaults
from lensprobe.interventions.arm_presets import benchmark_key
from lensprobe.interventions.arm_settings import ArmSettings


def add_reproduce(subparsers) -> None:
    """Register ``lensprobe reproduce``."""
    p = subparsers.add_parser("reproduce", **describe(
        "reproduce", help="run a paper's table or figure as a recipe, the published numbers beside",
        description="Run a study recipe (lensprobe reproduce --list; or your own .toml file) and write its table "
                    "(CSV + Markdown + report page) with the paper's published numbers in columns beside the run's. "
                    "Evaluation rows are kept under OUT/runs, so a rerun resumes. The options of the run "
                    "(--limit, --max-new-tokens, --batch-size, --quick, --benchmark-data) can also be a recipe's [settings] "
                    "table; the options given win."))
    add_inputs(p, RecipeOptions, ModelOptions, LimitOptions, QuickOptions, OutputOptions)
    add_config(p, RunSizeOptions, "run_size")  # --max-new-tokens, --batch-size: eval's
    add_config(p, ReproduceConfig, "config")  # --runs, --benchmark-data
    add_config(p, ArmSettings, "arm")
    p.set_defaults(func=run_reproduce, interrupted="evaluation rows are saved in OUT/runs; rerun the same command "
                                                   "to resume")


def data_from_args(values: list[str] | None, *, tasks: bool = False) -> dict[str, Path]:
    """``["aime2024=file.jsonl"]`` -> ``{"aime2024": Path("file.jsonl")}`` (names checked, files must exist;
    ``tasks``: the names are lm-eval task names, kept as given)."""
    data: dict[str, Path] = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep or not path:
            raise LensprobeError(f"--benchmark-data takes BENCHMARK=FILE (e.g. aime2024=aime_2022_2024.jsonl), got "
                                 f"{value!r}.")
        if not Path(path).expanduser().is_file():
            raise LensprobeError(f"--benchmark-data {value}: {path} does not exist.")
        key = name.strip() if tasks else benchmark_key(name)
        if key in data:  # one file per benchmark: the last would silently win
            raise SettingError("benchmark_data", f"{{setting}} names {key} twice ({data[key]} and {path}): give "
                                                 "one file per benchmark")
        data[key] = Path(path).expanduser()
    return data


def given_settings(args) -> ReproduceConfig:
    """The run's settings as the command line gives them (``None``: not given), read from each option's one class."""
    return replace(args.config, limit=args.LimitOptions.limit, quick=args.QuickOptions.quick, **args.run_size.given())


def _list_text() -> str:
    rows = [(r.name, r.kind, f"arXiv {r.arxiv}" + (f" Table {r.table}" if r.table else ""), r.title)
            for r in list_recipes()]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{n:<{widths[0]}}  {k:<{widths[1]}}  {src:<{widths[2]}}  {title}" for n, k, src, title in rows)


def run_reproduce(args) -> int:
    if args.RecipeOptions.list:
        print(_list_text())
        return 0
    if args.RecipeOptions.recipe is None:
        raise LensprobeError("name a recipe (lensprobe reproduce --list shows them) or give a .toml file.")
    check_common(args)  # every argument is checked before the model loads
    recipe = load_recipe(args.RecipeOptions.recipe)
    args.config = given_settings(args).over(recipe.settings)  # the recipe's settings, the options given on top
    data = data_from_args(args.config.benchmark_data, tasks=recipe.kind == "lm-eval")
    given = args.OutputOptions.out
    out = given if given is not None else Path(f"reproduce-{recipe.name}")
    check_reproduce(recipe, data=data, out=out, limit=args.config.limit, runs=args.config.runs,  # before the model
                    max_new_tokens=args.config.max_new_tokens, quick=bool(args.config.quick))
    check_out_dir(out, "reproduce")
    with writing_out_dir(out, "reproduce") as files:
        return _reproduce(args, recipe, data, out, files)


def _reproduce(args, recipe, data: dict[str, Path], out: Path, files: list[Path]) -> int:
    # an lm-eval recipe's ARM starts from the model's MATH-500 preset (the paper gives none for its tasks)
    benches = ("math500",) if recipe.kind == "lm-eval" else (recipe.benchmarks or (None,))
    layer_defaults = arm_layer_defaults(recipe.protocol)
    given = bool(args.arm.settings())
    for bench in benches if given else ():  # a partial --arm-* setting without a preset fails here
        args.arm.arm(args.ModelOptions.model, bench, layer_defaults=layer_defaults)
    model = load_cli_model(args)
    # --arm-* given: their ARM per benchmark; else reproduce takes each preset from --arm-source
    arms = {b: args.arm.arm(model, b, layer_defaults=layer_defaults) for b in benches if b is not None} if given \
        else None
    config: ReproduceConfig = args.config
    res = reproduce(recipe, model, out=out, limit=config.limit, max_new_tokens=config.max_new_tokens, data=data,
                    arm=arms or None, arm_source=args.arm.source, quick=bool(config.quick),
                    runs=config.runs, batch_size=config.batch_size or 8, progress=not args.OutputOptions.no_progress)
    if res.table is not None:
        print(markdown_table(res.table))
    for note in res.notes:
        print(f"note: {note}")
    files += res.files.values()  # the evaluation rows under OUT/runs are kept by the store
    for name, path in res.files.items():
        print(f"{name}: {path.resolve()}")
    return 0
