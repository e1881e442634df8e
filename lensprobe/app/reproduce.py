"""``lp.reproduce`` / ``lensprobe reproduce``: run a study recipe and put the published numbers beside.

A table recipe (:mod:`lensprobe.app.recipe`) evaluates its conditions on each benchmark it names under
its protocol (:func:`lensprobe.evaluate`, resumable result folders in ``OUT/runs/<benchmark>``; seeds
after the first in ``OUT/runs/<benchmark>.seed<k>``), grades with the authors' ``paper-exact``
(``math-verify`` beside), and writes:

- ``OUT/table.csv``: one row per (benchmark, condition): this run's columns (``run: n``, ``run: accuracy
  (authors' grader)``, its interval, runs and spread, ``run: accuracy (math-verify)``, ``run: comparable``),
  one column per model of the paper's table with the published number, then the facts each cell was
  computed under (``run: model``, ``run: model configuration``, ``run: weights digest``, ``run: dtype``, ...
  ``run: why not comparable``; :func:`~lensprobe.app.provenance.fact_columns`);
- ``OUT/table.json``: the same per cell, nested (facts, verdict and reasons, published numbers);
- ``OUT/table.md``: the table as Markdown, the run's facts and every cell's verdict with its reasons;
- ``OUT/report/index.html``: the same, accuracy bars and paired tests per benchmark;
- ``OUT/recipe.json``: the recipe whose run the folder holds (another recipe's run is refused).

A figure recipe draws its study (:data:`~lensprobe.app.reproduce_figures.FIGURES`) into
``OUT/report`` (numbers as CSV beside the page) and writes ``OUT/figure.md``.
"""

import dataclasses
import html
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lensprobe.app.provenance import (
    BENCHMARK_TOTALS,
    RUN_FACTS,
    arm_facts,
    fact_columns,
    readings,
    run_facts,
    verdict,
    verdict_text,
)
from lensprobe.app.recipe import Recipe, load_recipe
from lensprobe.app.reproduce_figures import curve_sections, figure_sections
from lensprobe.app.reproduce_lmeval import LMEVAL_COLUMNS, check_lmeval_data, lmeval_cells
from lensprobe.app.reproduce_runs import run_samples, runs_notes, seeded_runs, varies
from lensprobe.app.reproduce_samples import sample_columns, sample_rows
from lensprobe.app.reproduce_tables import (
    RUN_COLUMNS,
    beside_published,
    cell_text,
    check_fits,
    check_kind_settings,
    data_files,
    markdown_table,
    model_note,
    recipe_conditions,
    recipe_data,
    run_numbers,
)
from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import pandas
from lensprobe.core.models.facts import model_facts
from lensprobe.core.models.loading import model_label
from lensprobe.core.storage.store import atomic_file, atomic_write_json, atomic_write_text, read_json
from lensprobe.evals.running.protocols import get_protocol
from lensprobe.viz.eval_report import results_section
from lensprobe.viz.report import Section, write_report

__all__ = ["ReproduceResult", "check_reproduce", "reproduce"]

RECIPE_FILE = "recipe.json"
"""Names the recipe whose run an output folder holds."""


@dataclass(frozen=True)
class ReproduceResult:
    """What :func:`reproduce` ran and wrote.

    Attributes:
        recipe: the recipe run.
        table: this run's columns beside the published numbers (``None`` for a figure recipe).
        cells: per (benchmark, condition) run: the facts it was computed under, its verdict
            (``comparable``) and the reasons when not (what ``table.json`` holds).
        files: name -> path of every file written (``{}`` without ``out``).
        notes: what was skipped and why (a benchmark without data, ARM without a preset ...).
    """

    recipe: Recipe
    table: Any = None
    cells: tuple[dict, ...] = ()
    files: dict[str, Path] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def check_reproduce(recipe: str | os.PathLike | Recipe, *, data: dict | None = None, out: str | os.PathLike | None = None,
                    limit: int | None = None, runs: int | None = None, max_new_tokens: int | None = None,
                    quick: bool = False) -> Recipe:
    """Every check of :func:`reproduce` that needs no model, so a command can make them before it loads one:
    the recipe, ``limit`` and ``runs`` (and that the recipe's kind reads them: a figure recipe evaluates no
    problems, only a figure recipe reads ``quick``), each data file (a benchmark the recipe runs, a file that exists; for an
    lm-eval recipe a task file naming its task, and no ``runs`` or ``max_new_tokens``) and the output folder (it
    must not hold another recipe's run). Returns the recipe.

    Raises:
        LensprobeError: what is wrong, and what to do.

    Example:
        >>> check_reproduce("arm-table1", data={"aime2025": "aime2025.jsonl"})
        Traceback (most recent call last):
        LensprobeError: data for aime2025, which recipe 'arm-table1' does not run (it runs math500, aime2024): drop it.
    """
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    for name, value in (("limit", limit), ("runs", runs)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise LensprobeError(f"{name} must be a positive integer, got {value!r}.")
    check_kind_settings(recipe, limit=limit, runs=runs, max_new_tokens=max_new_tokens, quick=quick)
    if recipe.kind == "lm-eval":  # tasks of lm-eval, their data a task file each
        check_lmeval_data(recipe, data or {})
        given = [f for f, v in (("runs", runs), ("max_new_tokens", max_new_tokens)) if v is not None]
        if given:
            raise LensprobeError(f"recipe {recipe.name!r} runs lm-eval tasks, which set their own generation length and "
                                 f"run once: drop {' and '.join(given)}.")
    if recipe.kind != "lm-eval":
        data_files(recipe, data or {})
    if out is not None:
        _check_folder(recipe, Path(out).expanduser())
    return recipe


def _check_folder(recipe: Recipe, out: Path) -> None:
    held = read_json(out / RECIPE_FILE, fix="delete the folder to start over") if (out / RECIPE_FILE).is_file() else None
    if held is not None and not isinstance(held, dict):
        raise LensprobeError(f"{out / RECIPE_FILE} is not a recipe record (a JSON object): it was edited or damaged; "
                             f"delete {out} to start over, or give another --out.")
    if held is None and not any((out / f).exists() for f in ("table.md", "table.csv", "figure.md")):
        return
    if held is not None and held.get("recipe") == recipe.name:
        return
    what = f"the run of recipe {held.get('recipe')!r} ({held.get('source')})" if held else \
        "a reproduce table of an older lensprobe, whose recipe is not recorded"
    raise LensprobeError(f"{out} holds {what}; recipe {recipe.name!r} would replace its table and report. Give it its "
                         f"own folder (e.g. --out {out / recipe.name}), or delete {out} to start over.")


def reproduce(recipe: str | os.PathLike | Recipe, model, *, out: str | os.PathLike | None = None,
              limit: int | None = None, max_new_tokens: int | None = None, data: dict | None = None,
              arm: Any = None, arm_source: str = "code", runs: int | None = None, quick: bool = False,
              batch_size: int = 8, model_name: str | None = None, progress: bool = True) -> ReproduceResult:
    """Run a study recipe on ``model`` and compare it with the paper's published numbers.

    Every cell of the table carries the facts it was computed under and a verdict: *comparable* only
    when the model's configuration equals the named paper model's published one, the whole benchmark
    ran without error rows, and runs, sampling, dtype (fp32), prompt and ARM settings are the
    protocol's (:func:`~lensprobe.app.provenance.verdict`); otherwise every reason is listed.

    Args:
        recipe: a shipped recipe's name (``lensprobe reproduce --list``), a ``.toml`` file of
            your own, or a :class:`~lensprobe.app.recipe.Recipe`.
        model: a loaded model (``lp.load_model(...)``).
        out: output folder (table, Markdown, JSON, report; evaluation rows under ``runs/``, so a
            rerun resumes); ``None`` writes nothing. A folder holding another recipe's run is refused.
        limit: at most this many problems per benchmark (the first in file order).
        max_new_tokens: generated tokens per answer (default: the protocol's, 2048 for arm-math500).
        data: benchmark -> problem file for the benchmarks lensprobe does not ship
            (``{"aime2024": "aime_2022_2024.jsonl", "aime2025": "aime2025.jsonl"}``); a benchmark
            without data is skipped with a note.
        arm: the ARM of ``"ARM"`` conditions, or ``{benchmark: ARM}`` (default: the authors'
            preset for the model on each benchmark; without one, ARM rows are skipped with a note).
        arm_source: where the presets come from: ``"code"`` (the released code) or ``"paper"`` (Table 9).
        runs: seeded runs (seeds 0 .. runs-1), reported as their mean and standard deviation (default: the
            runs the paper averages, the recipe's ``runs``: 5 for Table 1). A condition whose rows do not
            depend on the seed (the run's protocol or format decodes greedily, whatever the model's generation
            config, and no intervention draws random numbers) runs once, and the table says so
            (:func:`~lensprobe.app.reproduce_runs.runs_notes`).
        quick: figure recipes: short inputs (a smoke run).
        batch_size: rows generated at once (continuous batching).
        model_name: the model's name, recorded in the rows and compared with the paper's models
            (default: the model's own).
        progress: show progress bars.

    Returns:
        A :class:`ReproduceResult`.

    Raises:
        LensprobeError: an unknown recipe or a bad recipe file, a data file for a benchmark the
            recipe does not run, a missing data file, an output folder of another recipe, or bad settings.

    Example:
        >>> res = lp.reproduce("arm-table1", lp.load_model(), limit=5, out="repro/table1")
        >>> res.table[["benchmark", "condition", "run: accuracy (authors' grader)", "Qwen2.5-Math-1.5B (Table 1)"]]
    """
    recipe = check_reproduce(recipe, data=data, out=out, limit=limit, runs=runs, max_new_tokens=max_new_tokens,
                             quick=quick)
    out_path = Path(out).expanduser() if out is not None else None
    claim = {}
    if out_path is not None:
        out_path.mkdir(parents=True, exist_ok=True)
        claim = {"recipe": atomic_write_json(out_path / RECIPE_FILE, {"recipe": recipe.name, "source": recipe.source},
                                             indent=2)}
    if recipe.kind == "figure":
        res = _figure(recipe, model, out_path, quick)
    elif recipe.kind == "lm-eval":
        res = _lmeval(recipe, model, model_name or model_label(model), out_path, arm=arm, arm_source=arm_source,
                      data=dict(data or {}), limit=limit, batch_size=batch_size)
    else:
        run = _Run(recipe, model, model_name or model_label(model), arm, arm_source, runs or recipe.runs,
                   {"batch_size": batch_size, **({"protocol": recipe.protocol} if recipe.protocol else {}),
                    **({"max_new_tokens": max_new_tokens} if max_new_tokens is not None else {})}, progress)
        res = _table(run, out_path, dict(data or {}), limit)
    return dataclasses.replace(res, files={**claim, **res.files})


@dataclass(frozen=True)
class _Run:
    recipe: Recipe
    model: Any
    name: str
    arm: Any
    arm_source: Any
    runs: int
    settings: dict
    progress: bool


def _table(run: _Run, out: Path | None, data: dict, limit) -> ReproduceResult:
    pd = pandas()
    problem_sets, data_facts, notes = recipe_data(run.recipe, data, limit)
    samples = run_samples(run.model, run.settings)  # the generation that runs, not the model's config alone
    results, cells, sections = [], [], []
    planned = {b: recipe_conditions(run.recipe, run.model, b, run.arm, arm_source=run.arm_source, name=run.name)
               for b in problem_sets}
    for bench, (conds, _) in planned.items():  # every benchmark's conditions, before the first forward
        check_fits(run.model, bench, problem_sets[bench], conds, run.settings)
    for bench, problems in problem_sets.items():
        conds, skipped = planned[bench]
        notes += skipped
        seeded = seeded_runs(run, bench, problems, conds, samples, out)
        for cond in conds:
            random = varies(cond, samples)
            rows = [rows for _, rows, _ in seeded if (rows["condition"] == cond.name).any()]
            for name, cell_runs, extra in sample_rows(run.recipe, cond.name, rows):
                numbers = {**run_numbers(name, cell_runs), **extra}
                cell = _cell(run, bench, cond.name, name, seeded, numbers, len(problems), random, data_facts[bench])
                numbers["run: comparable"] = cell["verdict"]
                results.append({"benchmark": bench, "condition": name, **numbers})
                cells.append(cell)
        notes += runs_notes(run.model, run.settings, bench, [c.name for c in conds if not varies(c, samples)],
                            run.runs)
        sections.append(results_section(seeded[0][1], title=f"{bench}: accuracy per condition", grader="paper-exact"))
        sections += curve_sections(run.recipe, bench, conds, seeded[0][1])
    columns = ["benchmark", "condition", *_run_columns(run.recipe)]
    table = beside_published(pd.DataFrame.from_records(results, columns=columns), run.recipe)
    files = _write_table(run, out, table, cells, sections, notes) if out is not None else {}
    return ReproduceResult(recipe=run.recipe, table=table, cells=tuple(cells), files=files, notes=tuple(notes))


def _lmeval(recipe: Recipe, model, name: str, out: Path | None, **how) -> ReproduceResult:
    """An lm-eval recipe: its tasks under each condition (:mod:`lensprobe.app.reproduce_lmeval`), beside the paper."""
    rows, cells, notes = lmeval_cells(recipe, model, name, **how)
    run = _Run(recipe, model, name, how["arm"], how["arm_source"], 1, {}, False)
    frame = pandas().DataFrame.from_records(rows, columns=["benchmark", "condition", *LMEVAL_COLUMNS])
    table = beside_published(frame, recipe)
    files = _write_table(run, out, table, cells, [], notes) if out is not None else {}
    return ReproduceResult(recipe=recipe, table=table, cells=tuple(cells), files=files, notes=tuple(notes))


def _run_columns(recipe: Recipe) -> tuple[str, ...]:
    return LMEVAL_COLUMNS if recipe.kind == "lm-eval" else (*RUN_COLUMNS, *sample_columns(recipe))


def _metric_text(recipe: Recipe) -> str:
    if recipe.kind == "lm-eval":
        return ("Accuracies in percent. The run's columns start with `run:`: `run: accuracy (lm-eval)` is lm-eval's "
                "metric on the task (`run: metric`, with its filter), with a 95% interval of 1.96 lm-eval standard "
                "errors; ")
    return ("Accuracies in percent. The run's columns start with `run:`: `run: accuracy (authors' grader)` is the "
            "authors' `is_equiv` (`paper-exact`, their tables' metric), the mean over `run: runs`, with its 95% "
            "Wilson interval (one run) or the runs' standard deviation; ")


def _cell(run: _Run, bench: str, source: str, name: str, seeded: list, numbers: dict, n_problems: int,
          varies: bool, data: dict | None = None) -> dict:
    """The cell of row ``name`` (condition ``source``'s own row, or a row computed from it: Best-of-N)."""
    seeds = [s for s, rows, _ in seeded if (rows["condition"] == source).any()]
    config = seeded[0][2]
    made = pandas().concat([rows[rows["condition"] == source] for _, rows, _ in seeded])
    facts = run_facts(run.model, config, name=run.name, rows=made)  # versions, device, dtype: as the rows record
    arm = arm_facts(config["parts"].get(source, {}), _named(run), bench)  # the preset that ran
    cell = {"benchmark": bench, "problems": n_problems, "of": BENCHMARK_TOTALS.get(bench), "runs": len(seeds),
            "seeds": seeds, "errors": numbers.pop("errors"), "arm": arm, "data": data}
    comparable, reasons = verdict(facts, cell, run.model, paper_runs=run.recipe.runs, random=varies,
                                  table_models=run.recipe.models, table=run.recipe.table, arxiv=run.recipe.arxiv)
    cell["readings"] = readings(facts, benchmark=bench, condition=name, table=run.recipe.table, random=varies,
                                arxiv=run.recipe.arxiv)
    return {"condition": name, "facts": facts, **cell, "varies with the seed": varies,
            "comparable": comparable, "verdict": verdict_text(comparable, cell["readings"]), "reasons": reasons,
            "columns": fact_columns(facts, cell, reasons)}


def _named(run: _Run):
    """The model as ARM presets see it: its facts under the name given (``model_name=``), so the preset and the
    verdict are the same model's."""
    return dataclasses.replace(model_facts(run.model), name=run.name)


def _write_table(run: _Run, out: Path, table, cells: list[dict], sections: list, notes: list[str]) -> dict[str, Path]:
    recipe = run.recipe
    protocol = get_protocol(recipe.protocol) if recipe.protocol else None
    shared = cells[0]["columns"] if cells else {}
    recorded = cells[0]["facts"]["model"] if cells else None  # as the run's folder records the model
    facts = [f"Recipe `{recipe.name}` ({recipe.source}): {recipe.title}.",
             f"Model: {run.name}. {model_note(run.model, recipe, run.name, recorded)}",
             *[f"{k.removeprefix('run: ').capitalize()}: {shared[k]}." for k in RUN_FACTS[1:] if k in shared],
             f"Protocol: {recipe.protocol or 'none'}" + (f" ({protocol.description})" if protocol else "") + ".",
             _metric_text(recipe) + _published_text(recipe),
             *([recipe.notes] if recipe.notes else []),
             *notes]
    verdicts = [f"{c['benchmark']} / {c['condition']}: " + c["verdict"]
                + (": " + "; ".join(c["reasons"]) if c["reasons"] else "")
                + ("; it rests on: " + "; ".join(c["readings"]) if c["readings"] else "")
                + f" (problems {c['columns']['run: problems']}, seeds "
                f"{c['columns']['run: seeds'] or 'none'}, error rows {c['errors']}"
                + (f", ARM {c['columns']['run: ARM']} from {c['columns']['run: ARM source']}" if c["arm"] else "") + ")"
                for c in cells]
    full = _with_facts(table, cells)
    paths = {"csv": out / "table.csv", "markdown": out / "table.md", "json": out / "table.json"}
    with atomic_file(paths["csv"]) as tmp:
        full.to_csv(tmp, index=False)
    atomic_write_json(paths["json"], _json(recipe, table, cells, notes), indent=2)
    md = [f"# {recipe.title}", "", *[f"- {f}" for f in facts], "", markdown_table(table), "", "## Comparability",
          "", *[f"- {v}" for v in verdicts], ""]
    atomic_write_text(paths["markdown"], "\n".join(md))
    intro = "".join(f"<p>{html.escape(f)}</p>" for f in facts)
    listed = "<ul>" + "".join(f"<li>{html.escape(v)}</li>" for v in verdicts) + "</ul>"
    summary = Section(title=recipe.title, intro=intro, html=[_html_table(table), "<h3>Comparability</h3>" + listed],
                      tables={"table": full})
    paths["report"] = write_report(out / "report", [summary, *sections], title=f"lensprobe reproduce {recipe.name}",
                                   meta={"model": run.name, "recipe": recipe.name})
    return paths


def _published_text(recipe: Recipe) -> str:
    if recipe.table is None:
        return (f"the paper (arXiv {recipe.arxiv}) publishes these numbers as a figure only, so there are no published "
                "numbers beside the run's: compare the shape by eye.")
    return f"the other columns are the paper's models as published (arXiv {recipe.arxiv}, Table {recipe.table})."


def _with_facts(table, cells: list[dict]):
    """``table`` with each run cell's facts as ``run: ...`` columns (published-only rows leave them empty)."""
    pd = pandas()
    facts = pd.DataFrame([{"benchmark": c["benchmark"], "condition": c["condition"], **c["columns"]} for c in cells])
    if not cells:
        return table
    full = table.merge(facts, on=["benchmark", "condition"], how="left")
    for col in (c for c in COUNT_FACTS if c in full):  # counts stay integers beside the published-only rows' gaps
        numbers = pd.to_numeric(full[col], errors="coerce")
        if numbers.notna().sum() == full[col].notna().sum():  # every value a count (an lm-eval cell's is words)
            full[col] = numbers.astype("Int64")
    return full


COUNT_FACTS = ("run: max new tokens", "run: error rows")
"""The fact columns that are counts (written as integers, ``2`` never ``2.0``)."""


def _json(recipe: Recipe, table, cells: list[dict], notes: list[str]) -> dict:
    published = [c for c in table.columns if recipe.table and c.endswith(f"(Table {recipe.table})")]
    rows = {(r["benchmark"], r["condition"]): r for r in table.to_dict("records")}
    out = []
    for c in cells:
        row = rows[(c["benchmark"], c["condition"])]
        out.append({**{k: v for k, v in c.items() if k != "columns"},
                    "run": {k: _plain(row[k]) for k in _run_columns(recipe)},
                    "published": {k: _plain(row[k]) for k in published}})
    return {"recipe": {"name": recipe.name, "title": recipe.title, "source": recipe.source, "arxiv": recipe.arxiv,
                       "table": recipe.table, "paper_runs": recipe.runs}, "cells": out, "notes": notes}


def _plain(v):
    return None if cell_text(v) == "" else (v.item() if hasattr(v, "item") else v)


def _html_table(table) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell_text(v))}</td>" for v in row)
                   + "</tr>" for row in table.itertuples(index=False))
    return f"<table class='data'><tr>{head}</tr>{body}</table>"


def _figure(recipe: Recipe, model, out: Path | None, quick: bool) -> ReproduceResult:
    sections = figure_sections(recipe.figure or "", model, quick=quick)
    if out is None:
        return ReproduceResult(recipe=recipe)
    index = write_report(out / "report", sections, title=f"lensprobe reproduce {recipe.name}",
                         meta={"model": model_label(model), "recipe": recipe.name})
    readme = atomic_write_text(out / "figure.md",
        f"# {recipe.title}\n\n- Recipe `{recipe.name}` ({recipe.source}); model: {model_label(model)}"
        f"{' (quick: short inputs)' if quick else ''}.\n- The paper (arXiv {recipe.arxiv}) publishes this as a "
        "figure without numbers: compare the shapes by eye.\n- Figure and numbers (CSV): `report/index.html`.\n"
        + (f"- {recipe.notes}\n" if recipe.notes else ""))
    return ReproduceResult(recipe=recipe, files={"report": index, "markdown": readme})
