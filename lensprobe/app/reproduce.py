"""``lp.reproduce`` / ``lensprobe reproduce``: run a study recipe and put the published numbers beside.

A table recipe (:mod:`lensprobe.app.recipe`) evaluates its conditions on each benchmark it names under
its protocol (:func:`lensprobe.evaluate`, resumable result folders in ``OUT/runs/<benchmark>``),
grades with the authors' ``paper-exact`` (``math-verify`` beside), and writes:

- ``OUT/table.csv``: one row per (benchmark, condition): this run's ``n``, accuracy and 95% interval
  under ``paper-exact``, ``math-verify``, then one column per model of the paper's table with the
  published number;
- ``OUT/table.md``: the same as Markdown, with the recipe, the protocol and what differs;
- ``OUT/report/index.html``: the table, accuracy bars and paired tests per benchmark.

A figure recipe draws its study (:data:`~lensprobe.app.reproduce_figures.FIGURES`) into
``OUT/report`` (numbers as CSV beside the page) and writes ``OUT/figure.md``.
"""

import html
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lensprobe.app.recipe import Recipe, load_recipe
from lensprobe.app.reproduce_figures import figure_sections
from lensprobe.app.reproduce_tables import (
    beside_published,
    cell_text,
    markdown_table,
    model_note,
    recipe_conditions,
    recipe_problems,
)
from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import pandas
from lensprobe.core.models.loading import model_label
from lensprobe.core.storage.store import atomic_file, atomic_write_text
from lensprobe.evals.harness import evaluate
from lensprobe.evals.protocols import get_protocol
from lensprobe.evals.stats import accuracy
from lensprobe.viz.eval_report import results_section
from lensprobe.viz.report import Section, write_report

__all__ = ["ReproduceResult", "reproduce"]


@dataclass(frozen=True)
class ReproduceResult:
    """What :func:`reproduce` ran and wrote.

    Attributes:
        recipe: the recipe run.
        table: this run beside the published numbers (``None`` for a figure recipe).
        files: name -> path of every file written (``{}`` without ``out``).
        notes: what was skipped and why (a benchmark without data, ARM without a preset ...).
    """

    recipe: Recipe
    table: Any = None
    files: dict[str, Path] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def reproduce(recipe: str | os.PathLike | Recipe, model, *, out: str | os.PathLike | None = None,
              limit: int | None = None, max_new_tokens: int | None = None, data: dict | None = None,
              arm: Any = None, quick: bool = False, batch_size: int = 8, model_name: str | None = None,
              progress: bool = True) -> ReproduceResult:
    """Run a study recipe on ``model`` and compare it with the paper's published numbers.

    Args:
        recipe: a shipped recipe's name (``lensprobe reproduce --list``), a ``.toml`` file of
            your own, or a :class:`~lensprobe.app.recipe.Recipe`.
        model: a loaded model (``lp.load_model(...)``).
        out: output folder (table, Markdown, report; evaluation rows under ``runs/``, so a
            rerun resumes); ``None`` writes nothing.
        limit: at most this many problems per benchmark (the first in file order).
        max_new_tokens: generated tokens per answer (default: the protocol's, 2048 for arm-math500).
        data: benchmark -> problem file for the benchmarks lensprobe does not ship
            (``{"aime2024": "aime_2022_2024.jsonl", "aime2025": "aime2025.jsonl"}``); a benchmark
            without data is skipped with a note.
        arm: the ARM of ``"ARM"`` conditions, or ``{benchmark: ARM}`` (default: the authors'
            preset for the model on each benchmark; without one, ARM rows are skipped with a note).
        quick: figure recipes: short inputs (a smoke run).
        batch_size: rows generated at once (continuous batching).
        model_name: name recorded in the rows (default: the model's).
        progress: show progress bars.

    Returns:
        A :class:`ReproduceResult`.

    Raises:
        LensprobeError: an unknown recipe or a bad recipe file, a data file for a benchmark the
            recipe does not run, a missing data file, or bad settings.

    Example:
        >>> res = lp.reproduce("arm-table1", lp.load_model(), limit=5, out="repro/table1")
        >>> res.table[["benchmark", "condition", "paper-exact", "Qwen2.5-Math-1.5B (Table 1)"]]
    """
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise LensprobeError(f"limit must be a positive integer, got {limit!r}.")
    out_path = Path(out).expanduser() if out is not None else None
    if recipe.kind == "figure":
        return _figure(recipe, model, out_path, quick)
    return _table(recipe, model, out_path, dict(data or {}), limit=limit, max_new_tokens=max_new_tokens, arm=arm,
                  batch_size=batch_size, model_name=model_name, progress=progress)


def _table(recipe: Recipe, model, out: Path | None, data: dict, *, limit, max_new_tokens, arm, batch_size,
           model_name, progress) -> ReproduceResult:
    pd = pandas()
    problem_sets, notes = recipe_problems(recipe, data, limit)
    settings: dict[str, Any] = {"batch_size": batch_size}
    if recipe.protocol is not None:
        settings["protocol"] = recipe.protocol
    if max_new_tokens is not None:
        settings["max_new_tokens"] = max_new_tokens
    results, sections = [], []
    for bench, problems in problem_sets.items():
        conds, skipped = recipe_conditions(recipe, model, bench, arm)
        notes += skipped
        rows = evaluate(model, problems, conds, out=None if out is None else out / "runs" / bench,
                        model_name=model_name, benchmark=bench, progress=progress, **settings)
        exact = accuracy(rows, "condition", grader="paper-exact")
        mv = accuracy(rows, "condition", grader="math-verify").set_index("condition")["accuracy"]
        for r in exact.itertuples():
            results.append({"benchmark": bench, "condition": r.condition, "n": r.n,
                            "paper-exact": round(100 * r.accuracy, 1), "low": round(100 * r.low, 1),
                            "high": round(100 * r.high, 1), "math-verify": round(100 * mv[r.condition], 1)})
        sections.append(results_section(rows, title=f"{bench}: accuracy per condition", grader="paper-exact"))
    run = pd.DataFrame.from_records(results, columns=["benchmark", "condition", "n", "paper-exact", "low", "high",
                                                      "math-verify"])
    table = beside_published(run, recipe)
    files = _write_table(recipe, model, out, table, sections, notes, limit, settings) if out is not None else {}
    return ReproduceResult(recipe=recipe, table=table, files=files, notes=tuple(notes))


def _write_table(recipe: Recipe, model, out: Path, table, sections: list, notes: list[str], limit,
                 settings: dict) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    protocol = get_protocol(recipe.protocol) if recipe.protocol else None
    facts = [f"Recipe `{recipe.name}` ({recipe.source}): {recipe.title}.",
             f"Model: {model_label(model)}. {model_note(model, recipe)}",
             f"Protocol: {recipe.protocol or 'none'}" + (f" ({protocol.description})" if protocol else "") + ".",
             f"Problems per benchmark: {'all' if limit is None else f'the first {limit}'}; settings: {settings}.",
             "Accuracies in percent; `paper-exact` is the authors' grader (their tables' metric), `low`/`high` its "
             "95% Wilson interval; the published columns are the paper's models (arXiv "
             f"{recipe.arxiv}, Table {recipe.table}).", *([recipe.notes] if recipe.notes else []), *notes]
    paths = {"csv": out / "table.csv", "markdown": out / "table.md"}
    with atomic_file(paths["csv"]) as tmp:
        table.to_csv(tmp, index=False)
    md = [f"# {recipe.title}", "", *[f"- {f}" for f in facts], "", markdown_table(table), ""]
    atomic_write_text(paths["markdown"], "\n".join(md))
    intro = "".join(f"<p>{html.escape(f)}</p>" for f in facts)
    summary = Section(title=recipe.title, intro=intro, html=[_html_table(table)], tables={"table": table})
    paths["report"] = write_report(out / "report", [summary, *sections], title=f"lensprobe reproduce {recipe.name}",
                                   meta={"model": model_label(model), "recipe": recipe.name})
    return paths


def _html_table(table) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell_text(v))}</td>" for v in row)
                   + "</tr>" for row in table.itertuples(index=False))
    return f"<table class='data'><tr>{head}</tr>{body}</table>"


def _figure(recipe: Recipe, model, out: Path | None, quick: bool) -> ReproduceResult:
    sections = figure_sections(recipe.figure or "", model, quick=quick)
    if out is None:
        return ReproduceResult(recipe=recipe)
    out.mkdir(parents=True, exist_ok=True)
    index = write_report(out / "report", sections, title=f"lensprobe reproduce {recipe.name}",
                         meta={"model": model_label(model), "recipe": recipe.name})
    readme = atomic_write_text(out / "figure.md",
        f"# {recipe.title}\n\n- Recipe `{recipe.name}` ({recipe.source}); model: {model_label(model)}"
        f"{' (quick: short inputs)' if quick else ''}.\n- The paper (arXiv {recipe.arxiv}) publishes this as a "
        "figure without numbers: compare the shapes by eye.\n- Figure and numbers (CSV): `report/index.html`.\n")
    return ReproduceResult(recipe=recipe, files={"report": index, "markdown": readme})
