"""Recipes run through EleutherAI's lm-eval (``kind = "lm-eval"``, Table 3b / Table 6): each benchmark is an lm-eval
task, run under each condition by :func:`~lensprobe.evals.lmeval.lm_eval_accuracy`, used by
:func:`lensprobe.app.reproduce.reproduce`.

**Data.** lensprobe ships none of these sets. A task given ``data`` (``--benchmark-data TASK=task.yaml``: an lm-eval task file
of your own that names the task, with its local data) runs from that file's folder (lm-eval's ``include_path``); any
other task is lm-eval's own, which loads its data from the Hugging Face hub. Offline (``HF_HUB_OFFLINE`` or
``HF_DATASETS_OFFLINE`` set) or when the hub cannot serve it, the task is skipped with a note naming where its data
comes from (the recipe's ``sources``) and how to give it: never a number.

**Numbers.** Accuracy in percent as lm-eval computes it (the recipe's ``metrics`` per task, ``acc`` by default;
lm-eval's ``strict-match`` filter where a task has several), its 95% interval ``+- 1.96 x`` lm-eval's standard
error, and the problems scored.
"""

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from lensprobe.app.provenance import fact_columns, model_reasons, run_facts
from lensprobe.app.recipe import Recipe
from lensprobe.core.errors import LensprobeError
from lensprobe.core.prompts.conditions import resolve_conditions
from lensprobe.core.storage.files import read_text
from lensprobe.core.storage.runidentity import model_identity
from lensprobe.evals.results.published import table_readings
from lensprobe.interventions.arm import ARM

__all__ = ["LMEVAL_COLUMNS", "check_lmeval_data", "lmeval_cells"]

RUN_N = "run: documents scored"
"""The lm-eval task's documents scored (lm-eval's ``n``)."""
LMEVAL_COLUMNS = (RUN_N, "run: accuracy (lm-eval)", "run: 95% CI low", "run: 95% CI high", "run: metric",
                  "run: comparable")
"""The run's columns of an lm-eval recipe (named so that none reads as the paper's)."""
OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_TASK = re.compile(r"^task:\s*['\"]?([^'\"\s#]+)", re.M)


def check_lmeval_data(recipe: Recipe, data: dict) -> dict[str, Path]:
    """``task -> task file`` of ``data``, checked before the model loads: a task the recipe runs, a ``.yaml`` file
    that exists and names that task.

    Raises:
        LensprobeError: what is wrong and what to give instead.
    """
    files = {}
    for task, path in data.items():
        if task not in recipe.benchmarks:
            raise LensprobeError(f"data for {task}, which recipe {recipe.name!r} does not run (it runs "
                                 f"{', '.join(recipe.benchmarks)}): drop it.")
        file = Path(path).expanduser()
        if not file.is_file() or file.suffix not in (".yaml", ".yml"):
            raise LensprobeError(f"data for {task}: {file} is not an lm-eval task file: give a .yaml task file that "
                                 f"names task {task} and loads your local copy of its data.")
        named = _TASK.findall(read_text(file, "lm-eval task file"))
        if task not in named:
            raise LensprobeError(f"data for {task}: {file} defines task(s) {named or 'none'}, not {task}: name it "
                                 f"'task: {task}' in the file.")
        files[task] = file
    return files


def _offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() not in ("", "0", "false", "no") for v in OFFLINE)


def _no_data(recipe: Recipe, task: str, why: str) -> str:
    source = recipe.sources.get(task, f"lm-eval task {task}")
    return (f"{task}: no data ({why}); it comes from {source}: run online (lm-eval downloads it) or pass --benchmark-data "
            f"{task}=task.yaml (an lm-eval task file naming {task} with your local copy); the published numbers are "
            "shown alone.")


def _arm(recipe: Recipe, model, arm: Any, arm_source: str, notes: list[str]) -> tuple[Any, str]:
    """The ARM of ``"ARM"`` conditions and where it comes from (``None`` and a note when there is none)."""
    if isinstance(arm, dict):
        arm = next(iter(arm.values()), None)
    if arm is not None:
        return arm, "given (arm= / --arm-*)"
    try:
        return ARM.preset(model, "math500", source=arm_source), f"the model's MATH-500 preset ({arm_source})"  # type: ignore[arg-type]
    except LensprobeError as err:
        notes.append(f"ARM rows skipped: the paper gives no ARM settings for these tasks and lensprobe takes the "
                     f"model's MATH-500 preset, but {err}")
        return None, ""


def _conditions(recipe: Recipe, arm: Any) -> list:
    """Names for conditions without ARM, :class:`~lensprobe.Condition` objects with it (so ARM attaches there only)."""
    out: list = []
    for name in recipe.conditions:
        if name == "ARM" or name.endswith("+ARM"):
            if arm is not None:
                out.append(resolve_conditions(name, arm=arm)[0])
        else:
            out.append(name)
    return out


def lmeval_cells(recipe: Recipe, model, name: str, *, arm: Any, arm_source: str, data: dict, limit: int | None,
                 batch_size: int) -> tuple[list[dict], list[dict], list[str]]:
    """``(rows, cells, notes)``: one row of the run's columns per (task, condition) run, each cell's facts and verdict,
    and what was skipped and why."""
    from lensprobe.evals.lmeval import lm_eval_accuracy

    files = check_lmeval_data(recipe, data)
    notes: list[str] = []
    arm, arm_from = _arm(recipe, model, arm, arm_source, notes)
    conditions = _conditions(recipe, arm)
    facts = _facts(model, name)
    rows, cells = [], []
    for task in recipe.benchmarks:
        where = files.get(task)
        if where is None and _offline():
            notes.append(_no_data(recipe, task, "offline, and no --benchmark-data given"))
            continue
        try:
            table = lm_eval_accuracy(model, [task], conditions, limit=limit, batch_size=batch_size,
                                     include_path=str(where.parent) if where else None,
                                     include_defaults=where is None, metric=recipe.metrics.get(task, "acc"))
        except Exception as err:  # lm-eval's own task could not load its data from the hub
            if where is not None:
                raise
            notes.append(_no_data(recipe, task, f"lm-eval could not load it: {type(err).__name__}: {err}"))
            continue
        for row in _picked(table, recipe.metrics.get(task, "acc")):
            cell = _cell(recipe, task, row, facts, arm if row["condition"] == "ARM" or
                         row["condition"].endswith("+ARM") else None, arm_from, limit, where)
            rows.append({"benchmark": task, "condition": row["condition"], **row["numbers"],
                         "run: comparable": "not comparable"})
            cells.append(cell)
    return rows, cells, notes


def _picked(table, metric: str) -> list[dict]:
    """One row per condition: lm-eval's ``strict-match`` filter where the task has several, else its only one."""
    out = []
    for cond, group in table.groupby("condition", sort=False):
        row = group[group["filter"] == "strict-match"].iloc[0] if (group["filter"] == "strict-match").any() \
            else group.iloc[0]
        acc, se = float(row["accuracy"]), float(row["stderr"])
        low, high = (max(0.0, acc - 1.96 * se), min(1.0, acc + 1.96 * se)) if se == se else (None, None)
        out.append({"condition": cond, "numbers": {
            RUN_N: int(row["n"]), LMEVAL_COLUMNS[1]: round(100 * acc, 1),
            LMEVAL_COLUMNS[2]: None if low is None else round(100 * low, 1),
            LMEVAL_COLUMNS[3]: None if high is None else round(100 * high, 1),
            LMEVAL_COLUMNS[4]: f"{metric} ({row['filter']})"}})
    return out


def _facts(model, name: str) -> dict:
    facts = run_facts(model, {"settings": {"model": model_identity(model), "generation": {}}}, name=name)
    return {**facts, "protocol": None, "prompt_format": "lm-eval (the task's own prompt and scoring)",
            "max_new_tokens": "the task's", "sampling": {}}


def _cell(recipe: Recipe, task: str, row: dict, facts: dict, arm: Any, arm_from: str, limit: int | None,
          where: Path | None) -> dict:
    reasons = model_reasons(facts["model"])
    if facts["dtype"] != "float32":
        reasons.append(f"dtype {facts['dtype']}; the authors ran float32")
    if limit is not None:
        reasons.append(f"limited to the first {limit} problems of the task")
    if where is not None:
        reasons.append(f"data from {where}, not lm-eval's copy of the published set")
    reasons.append("the paper does not say how these tasks were run (harness, shots, prompt, metric)")
    settings = {f.name: getattr(arm, f.name) for f in dataclasses.fields(arm)
                if f.name not in ("seed", "per_row", "source")} if arm is not None else None
    if arm is not None:
        reasons.append("the paper gives no ARM settings for these tasks")
    cell = {"problems": row["numbers"][RUN_N], "of": None, "runs": 1, "seeds": [], "errors": 0,
            "arm": {"settings": settings, "source": arm_from, "preset": None} if arm is not None else None,
            "data": str(where) if where else recipe.sources.get(task, f"lm-eval task {task}")}
    cell["readings"] = table_readings(recipe.table, row["condition"], recipe.arxiv) if recipe.table else []
    return {"benchmark": task, "condition": row["condition"], "facts": facts, **cell, "varies with the seed": False,
            "comparable": False, "verdict": "not comparable", "reasons": reasons,
            "columns": fact_columns(facts, cell, reasons)}
