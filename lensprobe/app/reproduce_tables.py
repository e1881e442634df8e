"""The parts of a table recipe's run: its problems per benchmark, its conditions, and its rows beside
the published numbers (used by :func:`lensprobe.app.reproduce.reproduce`)."""

import dataclasses
import math
import os
import statistics
from pathlib import Path
from typing import Any

from lensprobe.app.provenance import model_reasons, parameter_text
from lensprobe.app.recipe import Recipe
from lensprobe.core.errors import ContextLengthError, LensprobeError
from lensprobe.core.lazy import pandas
from lensprobe.core.models.facts import model_facts
from lensprobe.core.models.loading import model_label
from lensprobe.core.prompts.assembly import model_context
from lensprobe.core.prompts.conditions import PromptFormat, paper_conditions, resolve_conditions
from lensprobe.evals.results.benchdata import load_benchmark
from lensprobe.evals.results.published import paper_models, published_table
from lensprobe.evals.results.stats import accuracy
from lensprobe.evals.running.config import EvalConfig, with_format_defaults
from lensprobe.evals.running.protocols import arm_layer_defaults, get_protocol
from lensprobe.interventions.arm import ARM
from lensprobe.interventions.arm_presets import benchmark_key, model_key

__all__ = ["RUN_COLUMNS", "RUN_N", "RUN_PROBLEMS", "beside_published", "cell_text", "check_fits", "check_kind_settings", "markdown_table", "model_note", "recipe_conditions",
           "recipe_data", "recipe_problems", "run_numbers"]

RUN_N = "run: samples graded"
"""The run's column of graded rows, one per sample of a problem (error rows left out; its other columns:
:data:`RUN_COLUMNS`)."""
RUN_PROBLEMS = "run: problems graded"
"""The run's column of problems with at least one graded sample (``run: samples graded`` over the samples per
problem, when none failed)."""
RUN_COLUMNS = (RUN_PROBLEMS, "run: accuracy (authors' grader)", "run: 95% CI low", "run: 95% CI high", "run: runs",
               "run: sd over runs", "run: accuracy (math-verify)", "run: comparable", RUN_N)
"""This run's columns, named so that none reads as the paper's: problems graded, the authors' grader (``paper-exact``,
the mean over the runs), its 95% Wilson interval (one run), the runs and their standard deviation, math-verify, the
verdict, and samples graded."""
BUILT_IN = ("math500",)
"""Benchmarks whose problems lensprobe ships; the others need a data file."""


def data_files(recipe: Recipe, data: dict[str, str | os.PathLike]) -> dict[str, Path]:
    """``benchmark -> problem file`` of the ``--benchmark-data`` given, each checked: a benchmark the recipe runs, a file
    that exists.

    Raises:
        LensprobeError: a data file for a benchmark the recipe does not run, or a missing file.
    """
    files = {}
    for name, path in data.items():
        key = benchmark_key(name)
        if key not in recipe.benchmarks:
            raise LensprobeError(f"data for {key}, which recipe {recipe.name!r} does not run (it runs "
                                 f"{', '.join(recipe.benchmarks)}): drop it.")
        if not Path(path).expanduser().is_file():
            raise LensprobeError(f"data file {path} for {key} does not exist: give a JSONL or Parquet problem file.")
        files[key] = Path(path).expanduser()
    return files


def recipe_problems(recipe: Recipe, data: dict[str, str | os.PathLike], limit: int | None
                    ) -> tuple[dict[str, list], list[str]]:
    """``benchmark -> problems`` for the recipe's benchmarks that have data, and notes on the others
    (:func:`recipe_data` without what each set was read from).

    Raises:
        LensprobeError: a data file for a benchmark the recipe does not run, or a missing file.

    Example:
        >>> sets, notes = recipe_problems(load_recipe("arm-table1"), {}, 5)
        >>> list(sets), notes[0][:40]
        (['math500'], 'aime2024: no problems (lensprobe ships ')
    """
    sets, _, notes = recipe_data(recipe, data, limit)
    return sets, notes


def recipe_data(recipe: Recipe, data: dict[str, str | os.PathLike], limit: int | None
                ) -> tuple[dict[str, list], dict[str, dict], list[str]]:
    """``benchmark -> problems`` for the recipe's benchmarks that have data, ``benchmark -> what they were read
    from`` (:func:`~lensprobe.evals.results.benchdata.data_facts`: path, size, problems, SHA-256), and notes on the
    benchmarks without data. Ids come from the benchmark named (:func:`~lensprobe.evals.results.benchdata.load_benchmark`).

    Raises:
        LensprobeError: a data file for a benchmark the recipe does not run, or a missing file.
    """
    files = data_files(recipe, data)
    sets, facts, notes = {}, {}, []
    for bench in recipe.benchmarks:
        if bench not in files and bench not in BUILT_IN:
            notes.append(f"{bench}: no problems (lensprobe ships MATH-500 only): pass --benchmark-data {bench}=FILE "
                         "(data={'" + bench + "': FILE}) to run it; the published numbers are shown alone.")
            continue
        problems, facts[bench] = load_benchmark(bench, files.get(bench))
        sets[bench] = problems[:limit] if limit is not None else problems
    return sets, facts, notes


def check_kind_settings(recipe: Recipe, *, limit: int | None = None, runs: int | None = None,
                        max_new_tokens: int | None = None, quick: bool = False) -> None:
    """Refuse a setting the recipe's kind would ignore: a figure recipe evaluates no problems (``limit``,
    ``runs``, ``max_new_tokens``), and only a figure recipe has inputs ``quick`` can shorten.

    Example:
        >>> check_kind_settings(load_recipe("arm-table1"), quick=True)
        Traceback (most recent call last):
        LensprobeError: recipe 'arm-table1' evaluates problems; quick shortens only a figure recipe's inputs: drop it (limit runs fewer problems).
    """
    if recipe.kind == "figure":
        given = [n for n, v in (("limit", limit), ("runs", runs), ("max_new_tokens", max_new_tokens)) if v is not None]
        if given:
            raise LensprobeError(f"recipe {recipe.name!r} draws a figure from fixed inputs and evaluates no problems, so "
                                 f"{' and '.join(given)} would change nothing: drop {'it' if len(given) == 1 else 'them'} "
                                 "(quick makes its inputs short).")
    elif quick:
        raise LensprobeError(f"recipe {recipe.name!r} evaluates problems; quick shortens only a figure recipe's "
                             "inputs: drop it (limit runs fewer problems).")


def check_fits(model, bench: str, problems: list, conds: list, settings: dict) -> None:
    """Refuse a condition none of whose prompts fits the model's context with the generation's length
    (every row would be an error row, and the table could compare nothing), before anything runs.

    Raises:
        LensprobeError: names the condition, its shortest prompt and the context; or, when no prompt of it
            could be built for another reason (a control token in a problem's text), the first such refusal.
    """
    config = EvalConfig(**with_format_defaults(model, settings))
    n_ctx = int(model.cfg.n_ctx)
    for cond in conds:
        build, shortest, refused = cond.prompt_builder(model), None, None
        for p in problems:
            try:
                length = len(build(p.problem))
            except ContextLengthError:  # longer than the context on its own
                continue
            except LensprobeError as err:  # refused for what it holds (a control token): its own reason, no length
                refused = refused or f"problem {p.id!r}: {err}"
                continue
            shortest = length if shortest is None else min(shortest, length)
            if length + config.max_new_tokens <= n_ctx:
                break
        else:
            if shortest is None and refused is not None:
                raise LensprobeError(f"{bench}: condition {cond.name!r} builds no prompt the model can run, so every "
                                     f"row would fail; the first refused, {refused}")
            size = (f"its shortest prompt ({shortest} tokens) + max_new_tokens ({config.max_new_tokens}) exceeds it"
                    if shortest is not None else "each of its prompts alone exceeds it")
            raise LensprobeError(f"{bench}: condition {cond.name!r} fits no problem in the model's context of {n_ctx} "
                                 f"tokens ({size}), so every row would fail: lower "
                                 "max_new_tokens, shorten the condition's filler, or use a model with a longer "
                                 "context.")


def recipe_conditions(recipe: Recipe, model, bench: str, arm: Any = None, *,
                      arm_source: str = "code", name: str | None = None) -> tuple[list, list[str]]:
    """The recipe's conditions on ``bench`` (its ``define`` entries built from the protocol's prompt),
    and notes: ARM conditions are dropped when the model has no preset there and no ``arm`` is given.
    ARM conditions attach ``arm`` (or ``arm[bench]``), else the model's preset on ``bench`` from
    ``arm_source`` (``"code"`` or ``"paper"``; the decoder-layer defaults under a protocol that runs them). ``name``:
    the model's name as given (``model_name=``), which picks the preset where the configuration does not.

    Example:
        >>> conds, notes = recipe_conditions(load_recipe("arm-table3a"), model, "math500")
    """
    system: dict[str, Any] = {"system": get_protocol(recipe.protocol).system} if recipe.protocol else {}
    fmt: PromptFormat = "paper" if recipe.protocol else "chat"
    builtins = dict(paper_conditions(prompt_format=fmt, **system))
    for name, spec in recipe.define.items():
        kwargs: dict[str, Any] = {k: spec[k] for k in ("symbol", "count", "word") if k in spec}
        check_filler_fits(model, kwargs, f"{recipe.source}: define.{name!r}")
        base = paper_conditions(prompt_format=fmt, **system, **kwargs)
        if spec["base"] not in base:
            raise LensprobeError(f"{recipe.source}: define.{name!r}: base {spec['base']!r} is not a built-in "
                                 f"condition ({tuple(base)}).")
        builtins[name] = dataclasses.replace(base[spec["base"]], name=name,
                                             placement=spec.get("placement", base[spec["base"]].placement))
    names, notes = list(recipe.conditions), []
    if isinstance(arm, dict):  # one ARM per benchmark
        arm = arm.get(bench)
    if arm is None and any(n == "ARM" or n.endswith("+ARM") for n in names):
        try:
            named = dataclasses.replace(model_facts(model), name=name) if name else model
            arm = ARM.preset(named, bench, source=arm_source,  # type: ignore[arg-type]
                             layer_defaults=arm_layer_defaults(recipe.protocol))
        except LensprobeError as err:
            names = [n for n in names if not (n == "ARM" or n.endswith("+ARM"))]
            notes.append(f"{bench}: ARM rows skipped: {err}")
    defined = {name: builtins[name] for name in recipe.define}  # names the built-in resolver does not know
    conds = [defined.get(n) or resolve_conditions(n, builtins=builtins, arm=arm)[0] for n in names]
    return conds, notes


def check_filler_fits(model, spec: dict[str, Any], where: str) -> None:
    """Refuse a filler of ``spec["count"]`` repetitions that cannot fit ``model``'s context, before its text is
    built: each repetition takes at least the tokens of the shorter of its symbol and word (one at least).

    Raises:
        LensprobeError: the count times the tokens per repetition exceeds the context, naming both.
    """
    n_ctx, count = model_context(model), spec.get("count")
    if n_ctx is None or count is None:
        return
    tokenizer = getattr(model, "tokenizer", None)
    per = 1
    if tokenizer is not None:
        items = (" " + spec.get("symbol", "/"), " " + spec.get("word", "he"))
        per = max(1, min(len(tokenizer.encode(item, add_special_tokens=False)) for item in items))
    if count * per > n_ctx:
        raise LensprobeError(f"{where}: count {count:,} x {per} token(s) per repetition exceeds the model's context "
                             f"of {n_ctx:,} tokens: lower count.")


def beside_published(run, recipe: Recipe):
    """The run's rows with one column per model of the recipe's published table (``"<model> (Table
    T)"``), matched on (benchmark, condition) (a recipe without ``table``: the run's rows alone); published rows the run lacks are kept (run columns
    empty), the table's other benchmarks and conditions too (shown as published). A cell the paper
    prints as "-" reads what it means there (Table 2: ``"< 5"``).

    Example:
        >>> beside_published(run, load_recipe("arm-table1")).columns[:4].tolist()
        ['benchmark', 'condition', 'run: n', "run: accuracy (authors' grader)"]
    """
    if recipe.kind == "figure":
        raise LensprobeError(f"recipe {recipe.name!r} is a figure recipe: only a table recipe has published numbers.")
    if recipe.table is None:  # the paper publishes a figure only: the run's rows alone
        return _typed(run.copy())
    pub = published_table(recipe.table, recipe.arxiv)
    pub["shown"] = [t if v is None or v != v else v for v, t in zip(pub["value"], pub["text"], strict=True)]
    wide = pub.pivot_table(index=["benchmark", "condition"], columns="model", values="shown", sort=False,
                           dropna=False, aggfunc="first")
    wide.columns = [f"{m} (Table {recipe.table})" for m in wide.columns]
    order = _row_order(run, recipe)
    for key in wide.index:  # then the paper's other rows
        order.setdefault(key, len(order))
    table = run.merge(wide.reset_index(), on=["benchmark", "condition"], how="outer", sort=False)
    table["_o"] = [order[(b, c)] for b, c in zip(table["benchmark"], table["condition"], strict=True)]
    return _typed(table).sort_values("_o", kind="stable").drop(columns="_o").reset_index(drop=True)


def _row_order(run, recipe: Recipe) -> dict:
    """(benchmark, condition) -> position: benchmark by benchmark, the recipe's conditions, then the run's other rows
    (a Best-of-N row)."""
    order: dict = {}
    for bench in [*recipe.benchmarks, *run["benchmark"]]:
        for cond in [*recipe.conditions, *run[run["benchmark"] == bench]["condition"]]:
            order.setdefault((bench, cond), len(order))
    return order


def _typed(table):
    """The run's counts as integers and its percentages as floats (``None`` where not measured)."""
    for col in (c for c in (RUN_N, RUN_PROBLEMS, RUN_COLUMNS[4], "run: documents scored") if c in table):  # counts (published-only rows have none)
        table[col] = table[col].astype("Int64")
    percent = [c for c in table.columns if c in (*RUN_COLUMNS[1:4], *RUN_COLUMNS[5:7])
               or (c.startswith("run: ") and ("pass@" in c or "(lm-eval)" in c))]
    for col in percent:  # percentages (None where not measured)
        table[col] = pandas().to_numeric(table[col]).astype(float)
    return table


def run_numbers(name: str, runs: list) -> dict:
    """One condition's numbers over its seeded runs (``runs``: each run's result rows): the first run's problems with
    a graded sample and its graded samples (rows), the authors' grader's mean accuracy in percent, its 95% Wilson interval (one run
    only), the runs, their standard deviation (two or more), math-verify's mean, and ``errors`` (rows
    without a verdict, over all runs)."""
    exact: list[float] = []
    mv: list[float] = []
    n: int | None = None
    problems: int | None = None
    errors, low, high = 0, 0.0, 0.0
    for rows in runs:
        mine = rows[rows["condition"] == name]
        graded = mine[mine["paper-exact"].notna()]
        errors += len(mine) - len(graded)
        n = len(graded) if n is None else n
        problems = int(graded["problem_id"].nunique()) if problems is None else problems
        if len(graded):
            acc = accuracy(graded, "condition", grader="paper-exact").iloc[0]
            exact.append(100 * acc["accuracy"])
            low, high = 100 * acc["low"], 100 * acc["high"]
            mv.append(100 * graded["math-verify"].astype(float).mean())
    one = len(runs) == 1 and bool(exact)
    return {RUN_PROBLEMS: problems, RUN_N: n, RUN_COLUMNS[1]: _mean(exact), RUN_COLUMNS[2]: round(low, 1) if one else None,
            RUN_COLUMNS[3]: round(high, 1) if one else None, RUN_COLUMNS[4]: len(runs),
            RUN_COLUMNS[5]: round(statistics.stdev(exact), 1) if len(exact) > 1 else None,
            RUN_COLUMNS[6]: _mean(mv), "errors": errors}


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 1) if values else None


def cell_text(v) -> str:
    """A table cell as text: empty for a missing value (``None``, ``NaN``, ``pd.NA``)."""
    if v is None or v is pandas().NA or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(v)


def markdown_table(table) -> str:
    """``table`` as a Markdown pipe table (empty cells for missing values)."""
    cell = cell_text
    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def model_note(model, recipe: Recipe, name: str | None = None, facts: dict | None = None) -> str:
    """A sentence on whether ``model`` (named ``name``, default its own name) is one of the paper's
    models: only when the name is one and its configuration equals the published one. ``facts``: the
    run's model facts (:func:`~lensprobe.app.provenance.run_facts`, as its folder records them); default:
    read from ``model.cfg``.

    Example:
        >>> model_note(lp.load_model(), load_recipe("arm-table1"))[:40]
        'SmolLM2-135M-Instruct (135M parameters) '
    """
    name = name or model_label(model)
    params = sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else 0
    size = f" ({parameter_text(params)} parameters)" if params else ""
    key = model_key(name)
    published = paper_models(recipe.arxiv)
    if key not in published:
        return (f"{model_label(model)}{size} is not one of the paper's models (1.5B-32B parameters): it cannot reach "
                "their numbers. Read the table's shape (conditions side by side), not its values.")
    cfg = model.cfg
    facts = facts or {"name": name, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "d_model": cfg.d_model,
                      "n_kv_heads": getattr(cfg, "n_key_value_heads", None) or cfg.n_heads, "d_vocab": cfg.d_vocab}
    differs = model_reasons({**facts, "name": name})
    if not differs:
        return (f"{name}{size}: one of the paper's models, its configuration equal to the published one "
                f"({published[key]['source']}).")
    return f"{model_label(model)}{size} is not the paper's model: {differs[0]}. Read the table's shape, not its values."
