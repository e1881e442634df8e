"""The parts of a table recipe's run: its problems per benchmark, its conditions, and its rows beside
the published numbers (used by :func:`lensprobe.app.reproduce.reproduce`)."""

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from lensprobe.app.recipe import Recipe
from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import pandas
from lensprobe.core.models.loading import model_label
from lensprobe.core.prompts.conditions import PromptFormat, paper_conditions, resolve_conditions
from lensprobe.evals.data import load_math500, load_problems
from lensprobe.evals.protocols import arm_layer_defaults, get_protocol
from lensprobe.evals.published import published_table
from lensprobe.interventions.arm import ARM
from lensprobe.interventions.arm_presets import benchmark_key, model_key

__all__ = ["beside_published", "cell_text", "markdown_table", "model_note", "recipe_conditions", "recipe_problems"]

BUILT_IN = ("math500",)
"""Benchmarks whose problems lensprobe ships; the others need a data file."""


def recipe_problems(recipe: Recipe, data: dict[str, str | os.PathLike], limit: int | None
                    ) -> tuple[dict[str, list], list[str]]:
    """``benchmark -> problems`` for the recipe's benchmarks that have data, and notes on the others.

    Raises:
        LensprobeError: a data file for a benchmark the recipe does not run, or a missing file.

    Example:
        >>> sets, notes = recipe_problems(load_recipe("arm-table1"), {}, 5)
        >>> list(sets), notes[0][:40]
        (['math500'], 'aime2024: no problems (lensprobe ships ')
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
    sets, notes = {}, []
    for bench in recipe.benchmarks:
        if bench in files:
            problems = load_problems(files[bench])
        elif bench in BUILT_IN:
            problems = load_math500()
        else:
            notes.append(f"{bench}: no problems (lensprobe ships MATH-500 only): pass --data {bench}=FILE "
                         "(data={'" + bench + "': FILE}) to run it; the published numbers are shown alone.")
            continue
        sets[bench] = problems[:limit] if limit is not None else problems
    return sets, notes


def recipe_conditions(recipe: Recipe, model, bench: str, arm: Any = None, *,
                      arm_source: str = "code") -> tuple[list, list[str]]:
    """The recipe's conditions on ``bench`` (its ``define`` entries built from the protocol's prompt),
    and notes: ARM conditions are dropped when the model has no preset there and no ``arm`` is given.
    ARM conditions attach ``arm`` (or ``arm[bench]``), else the model's preset on ``bench`` from
    ``arm_source`` (``"code"`` or ``"paper"``; the decoder-layer defaults under a protocol that runs them).

    Example:
        >>> conds, notes = recipe_conditions(load_recipe("arm-table3a"), model, "math500")
    """
    system: dict[str, Any] = {"system": get_protocol(recipe.protocol).system} if recipe.protocol else {}
    fmt: PromptFormat = "paper" if recipe.protocol else "chat"
    builtins = dict(paper_conditions(prompt_format=fmt, **system))
    for name, spec in recipe.define.items():
        kwargs: dict[str, Any] = {k: spec[k] for k in ("symbol", "count", "word") if k in spec}
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
            arm = ARM.preset(model, bench, source=arm_source,  # type: ignore[arg-type]
                             layer_defaults=arm_layer_defaults(recipe.protocol))
        except LensprobeError as err:
            names = [n for n in names if not (n == "ARM" or n.endswith("+ARM"))]
            notes.append(f"{bench}: ARM rows skipped: {err}")
    defined = {name: builtins[name] for name in recipe.define}  # names the built-in resolver does not know
    conds = [defined.get(n) or resolve_conditions(n, builtins=builtins, arm=arm)[0] for n in names]
    return conds, notes


def beside_published(run, recipe: Recipe):
    """The run's rows with one column per model of the recipe's published table (``"<model> (Table
    T)"``), matched on (benchmark, condition); published rows the run lacks are kept (run columns
    empty).

    Example:
        >>> beside_published(run, load_recipe("arm-table1")).columns[:4].tolist()
        ['benchmark', 'condition', 'n', 'paper-exact']
    """
    if recipe.table is None:
        raise LensprobeError(f"recipe {recipe.name!r} is a {recipe.kind} recipe: only a table recipe has published numbers.")
    pub = published_table(recipe.table, recipe.arxiv)
    pub = pub[pub["benchmark"].isin(recipe.benchmarks) & pub["condition"].isin(recipe.conditions)]
    wide = pub.pivot_table(index=["benchmark", "condition"], columns="model", values="value", sort=False,
                           dropna=False, aggfunc="first")
    wide.columns = [f"{m} (Table {recipe.table})" for m in wide.columns]
    order = {(b, c): i for i, (b, c) in enumerate((b, c) for b in recipe.benchmarks for c in recipe.conditions)}
    table = run.merge(wide.reset_index(), on=["benchmark", "condition"], how="outer")
    table["_o"] = [order.get((b, c), len(order)) for b, c in zip(table["benchmark"], table["condition"], strict=True)]
    table["n"] = table["n"].astype("Int64")  # published-only rows have no count
    return table.sort_values("_o", kind="stable").drop(columns="_o").reset_index(drop=True)


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


def model_note(model, recipe: Recipe) -> str:
    """A sentence saying whether ``model`` is one of the paper's models, and what to expect if not.

    Example:
        >>> model_note(lp.load_model(), load_recipe("arm-table1"))[:40]
        'SmolLM2-135M-Instruct is a 135M-paramete'
    """
    key = model_key(model_label(model))
    paper = {model_key(m) for m in recipe.models}
    if key in paper:
        return "One of the paper's models."
    params = sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else 0
    size = f"a {params / 1e6:.0f}M-parameter model" if params else "not one of the paper's models"
    return (f"{model_label(model)} is {size}, not one of the paper's models (1.5B-32B parameters): it cannot "
            "reach their numbers. Read the table's shape (conditions side by side), not its values.")
