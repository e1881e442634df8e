"""Running an evaluation's rows: what is still to generate, grouped into generation calls, then
generated, graded and written one by one as each row finishes.

:func:`plan_rows` builds every pending (condition, problem, sample) row's prompt before anything
runs (a prompt that cannot be built becomes an error row) and orders them in chunks of
:func:`plan_chunk` problems, condition by condition, so a stopped run has every condition's
first rows. :func:`run_plan` hands each condition's chunk to :func:`lensprobe.generate` with
continuous batching (``batch_size`` rows live, a finished row's slot refilled at once); each row
is graded, written and synced as soon as it finishes. :func:`lensprobe.evaluate` (in
:mod:`lensprobe.evals.running.harness`) checks the inputs, prepares the folder and assembles the table.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lensprobe.core.errors import LensprobeError, LensprobeWarning
from lensprobe.core.hooks.attach import batch_dependent, check_positions, resolve_hooks
from lensprobe.core.hooks.capabilities import bind_interventions
from lensprobe.core.lazy import pandas
from lensprobe.core.models.facts import ModelFacts, model_facts
from lensprobe.core.progress import tqdm
from lensprobe.core.prompts.conditions import QUESTION_PLACEHOLDER, Condition
from lensprobe.core.storage.jsonable import json_digest, prompt_ids_digest
from lensprobe.core.storage.rowfiles import RowWriter
from lensprobe.evals.grading.extract import extract_answer
from lensprobe.evals.grading.grade import GRADERS, PaperGraderError, grade_all, grade_paper_exact
from lensprobe.evals.grading.mathverify import GRADE_TIMEOUT
from lensprobe.evals.problems.load import Problem
from lensprobe.evals.results.folder import read_rows, results_file, rows_frame, settled_rows
from lensprobe.evals.results.verdicts import PAPER_EXACT
from lensprobe.evals.running.config import EvalConfig
from lensprobe.evals.running.protocols import grades_prompt, ungradable_is_wrong
from lensprobe.generation.engines import engine_name, engine_to_run
from lensprobe.generation.loop import generate
from lensprobe.generation.rows import FinishedRow

__all__ = ["PAPER_EXACT", "ROW_COLUMNS", "ErrorRowsWarning", "Item", "RunInfo", "check_done_prompts", "condition_engine",
           "finished_rows", "generation_calls", "make_row", "plan_chunk", "plan_rows", "problem_hash",
           "result_table", "run_plan", "tally_rows"]


def problem_hash(problem: Problem) -> str:
    """The digest of a problem's text and answer (rows of other data under the same id are refused)."""
    return json_digest([problem.problem, problem.answer])


@dataclass
class Item:
    """One row to generate: a problem, its sample index and its prompt under the row's condition."""

    problem: Problem
    sample: int
    prompt: Any  # Prompt, or None when it could not be built
    error: str | None = None  # why the prompt could not be built


def generation_calls(items: list[Item], cond: Condition, config: EvalConfig):
    """Split one condition's pending items into generation calls: ``(items, interventions, batch size)``.

    Items whose interventions change when bound to their prompt are generated alone, and so
    is every item of a condition with a batch-dependent intervention (its ``batch_dependent``
    capability, e.g. ``lp.ARM(per_row=False)``: statistics over the whole batch); with
    sampling, alone means with the problem's other samples. The other items go in one call,
    run with continuous batching (``config.batch_size`` rows live at once); a call of items
    generated alone runs its rows as one batch (batch size ``None``) whatever ``batch_size``.
    """
    shared: list[Item] = []
    alone = bool(batch_dependent(cond.interventions))
    if alone and config.do_sample:
        groups: dict[str, list[Item]] = {}
        for it in items:
            groups.setdefault(it.problem.id, []).append(it)
        for group in groups.values():
            yield group, bind_interventions(cond.interventions, group[0].prompt)[0], None
        return
    for it in items:
        inter, changed = bind_interventions(cond.interventions, it.prompt)
        if changed or alone:
            yield [it], inter, None
        else:
            shared.append(it)
    if shared:  # one call: batch_size rows live at once, finished rows refilled (continuous batching)
        yield shared, cond.interventions, config.batch_size


@dataclass(frozen=True)
class RunInfo:
    """What every row of a run records besides its own result."""

    model_name: str
    run_hash: str | None  # None: a run kept in memory whose identity could not be described
    condition_hashes: dict[str, str | None]
    rank: int
    engines: dict[str, str] = field(default_factory=dict)  # condition -> its engine ("hf", "bridge", "hooked")
    environment: dict[str, str] = field(default_factory=dict)  # versions, device, dtype: run_environment()


def condition_engine(model, cond: Condition) -> str:
    """The engine that runs ``cond`` on ``model`` (its ``engine`` generation setting, ``"auto"`` resolved):
    recorded with the condition in ``config.json`` and in every row, and the one its rows run on."""
    template = cond.prompt_builder(model)(QUESTION_PLACEHOLDER)
    try:  # the first place a condition's interventions meet the model: name the condition in the refusal
        bound = bind_interventions(cond.interventions, template)[0]
        return engine_name(model, cond.generate_kwargs.get("engine", "auto"), interventions=bound)
    except LensprobeError as err:
        raise LensprobeError(f"condition {cond.name!r}: {err}") from None


def check_done_prompts(model, conds: list[Condition], done: dict, problems: list[Problem], out: Path) -> None:
    """Refuse a finished row whose prompt, built again now, has other token ids than the row records
    (a tokenizer or a prompt builder that changed): its result belongs to another prompt."""
    builders = {c.name: c.prompt_builder(model) for c in conds}
    texts = {p.id: p.problem for p in problems}
    for (cname, pid, sample), row in done.items():
        if cname not in builders or pid not in texts:
            continue
        try:
            prompt = builders[cname](texts[pid])
        except LensprobeError as err:  # e.g. a control token its text makes, refused since the row was written
            raise LensprobeError(
                f"{out} holds the row of condition {cname!r}, problem {pid!r}, sample {sample}, whose prompt this run "
                f"refuses ({err}). Use a new output folder, or delete that row's line.") from None
        recorded = row.get("prompt_ids")
        if recorded != prompt_ids_digest(prompt):
            raise LensprobeError(
                f"{out} holds the row of condition {cname!r}, problem {pid!r}, sample {sample} with prompt token ids "
                f"{recorded!r} ({row.get('prompt_tokens')} tokens), but this run builds its prompt as "
                f"{prompt_ids_digest(prompt)!r} ({len(prompt)} tokens): the tokenizer or the condition's prompt "
                "builder changed, so its result belongs to another prompt. Use a new output folder, or delete that "
                "row's line to generate it again.")


def finished_rows(out: Path, problems: list[Problem]) -> dict[tuple, dict]:
    """Rows already in ``out`` by (condition, problem id, sample); refuses rows of other data.

    Error rows (``finish="error"``: the row could not run) are not finished: a resumed run
    tries them again, and a row that then runs replaces the error row in every table.
    """
    done: dict[tuple, dict] = {}
    by_id = {p.id: problem_hash(p) for p in problems}
    for row in settled_rows(read_rows(out)):  # the store's one merge rule
        expected = by_id.get(row["problem_id"])
        if expected is not None and row.get("problem_hash") != expected:
            raise LensprobeError(
                f"{out} holds a result for problem id {row['problem_id']!r} with a different problem "
                "text or answer: these are other data. Use a new output folder."
            )
        if row.get("finish") != "error":
            done[(row["condition"], row["problem_id"], row["sample"])] = row
    return done


def plan_rows(model, mine: list[Problem], conds: list[Condition], done: dict, config: EvalConfig,
              facts: ModelFacts | None = None) -> list[tuple[Condition, list[Item]]]:
    """The rows still to generate, chunk by chunk of problems, condition by condition.

    Every prompt is built before anything runs. A chunk holds :func:`plan_chunk` problems, so
    a stopped run has results for every condition on its first problems; within a chunk, a
    condition's rows run with continuous batching. ``facts``: the model's facts, read once by the
    run (:func:`~lensprobe.core.models.facts.model_facts`; ``None``: read here).
    """
    facts = facts if facts is not None else model_facts(model)
    builders = {c.name: c.prompt_builder(model, facts) for c in conds}
    plan: list[tuple[Condition, list[Item]]] = []
    chunk = plan_chunk(config)
    for start in range(0, len(mine), chunk):
        for cond in conds:
            items = []
            for p in mine[start:start + chunk]:
                samples = [s for s in range(config.n_samples) if (cond.name, p.id, s) not in done]
                if samples:
                    try:
                        prompt, error = builders[cond.name](p.problem), None
                    except LensprobeError as err:  # e.g. longer than the context: an error row
                        prompt, error = None, str(err)
                    items += [Item(p, s, prompt, error) for s in samples]
            if items:
                plan.append((cond, items))
    _check_interventions(model, plan, config, facts.n_ctx)
    return plan


def plan_chunk(config: EvalConfig) -> int:
    """Problems per chunk of an evaluation's plan: enough rows for continuous batching to keep
    ``batch_size`` rows busy (8 per live row), at least 32."""
    return max(32, 8 * config.batch_size // (config.n_samples if config.do_sample else 1))


def _check_interventions(model, plan: list[tuple[Condition, list[Item]]], config: EvalConfig, n_ctx: int) -> None:
    """Build each condition's hooks once (bound to its first prompt) and check its positions
    against its longest prompt + ``max_new_tokens``, so bad heads fail before any batch runs."""
    longest: dict[str, tuple[Condition, Any, int]] = {}
    for cond, items in plan:
        items = [it for it in items if it.prompt is not None]
        if not items:
            continue
        _, first, n = longest.get(cond.name, (cond, items[0].prompt, 0))
        fits = [len(it.prompt) for it in items if len(it.prompt) + config.max_new_tokens <= n_ctx]
        longest[cond.name] = (cond, first, max(n, *fits, 0))
    for cond, first, n in longest.values():
        bound = bind_interventions(cond.interventions, first)[0]
        try:
            resolve_hooks(model, bound)
            check_positions(bound, n + config.max_new_tokens, "prompt + max_new_tokens")
        except LensprobeError as err:
            raise LensprobeError(f"condition {cond.name!r}: {err}") from None


def tally_rows(done: dict, mine: list[Problem], conds: list[Condition]) -> dict[str, list[int]]:
    """``[right, graded]`` per condition over this shard's finished rows (for the progress bar)."""
    mine_ids = {p.id for p in mine}
    tally = {c.name: [0, 0] for c in conds}
    for (cname, pid, _), row in done.items():
        if cname in tally and pid in mine_ids:
            tally[cname][0] += bool(row.get("math-verify"))
            tally[cname][1] += 1
    return tally


def run_plan(model, plan, config: EvalConfig, info: RunInfo, tally: dict, *, out: Path | None,
              progress: bool, world_size: int, facts: ModelFacts | None = None) -> list[dict]:
    """Generate and grade every planned row; each is written (and synced) as soon as it is graded.
    ``facts``: the model's facts, read once by the run (``None``: read here), given to every generation.

    A row that cannot run (a prompt too long for the context, a failing forward) becomes an
    error row and the others go on; a ``KeyboardInterrupt`` stops the run with every row
    finished so far written.
    """
    total = sum(len(items) for _, items in plan)
    bar = _progress(total, progress, info.rank, world_size)
    path = results_file(out, info.rank) if out is not None else None
    # with nothing left to write, a lock left by a killed process is still taken over (and said so)
    writer = RowWriter(path) if path is not None and (total or RowWriter.lock_file(path).exists()) else None
    new_rows: list[dict] = []
    facts = facts if facts is not None else model_facts(model)

    def emit(it: Item, cond: Condition, ids: list[int], text: str, finish: str, error: str | None,
             seconds: float) -> None:
        row = make_row(it, cond, ids, text, finish, seconds, info, extract=config.extract, error=error,
                       exact_on_prompt=grades_prompt(config.protocol, config.prompt_format),
                       grade_timeout=config.grade_timeout,
                       ungradable_wrong=ungradable_is_wrong(config.protocol))
        if writer is not None:
            writer.write(row)
            writer.sync()
        new_rows.append(row)
        if row["math-verify"] is not None:  # None: no answer (an error or a broken generation)
            tally[cond.name][0] += row["math-verify"]
            tally[cond.name][1] += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(_accuracy_postfix(tally), refresh=False)

    try:
        for cond, items in plan:
            for it in items:
                if it.error is not None:
                    emit(it, cond, [], "", "error", it.error, 0.0)
            items = [it for it in items if it.error is None]
            for batch, interventions, batch_size in generation_calls(items, cond, config):
                _generate(model, facts, batch, interventions, cond, config, batch_size, emit,
                          info.engines.get(cond.name, "auto"))
    finally:
        if writer is not None:
            writer.close()
        if bar is not None:
            bar.close()
    errors = [r for r in new_rows if r["finish"] == "error"]
    if errors:
        warnings.warn(f"{len(errors)} row(s) could not run (finish 'error'; the reason is in their 'error' column), "
                      f"e.g. problem {errors[0]['problem_id']!r}: {errors[0]['error']} They are retried when the "
                      "run is resumed.", ErrorRowsWarning, stacklevel=3)
    return new_rows


class ErrorRowsWarning(LensprobeWarning):
    """Some rows of an evaluation could not run; each is an error row (``finish="error"``)."""


def result_table(rows: list[dict], conds: list[Condition], problems: list[Problem]):
    pd = pandas()
    if not rows:
        return pd.DataFrame(columns=ROW_COLUMNS)
    df = rows_frame(rows)
    corder = {c.name: i for i, c in enumerate(conds)}
    porder = {p.id: i for i, p in enumerate(problems)}
    df = df.assign(_c=df["condition"].map(corder), _p=df["problem_id"].map(porder))
    df = df.sort_values(["_c", "_p", "sample"], kind="stable").drop(columns=["_c", "_p"])
    return df.reset_index(drop=True)


ROW_COLUMNS = ["condition", "problem_id", "sample", "subject", "level", "answer", "prediction",
               *GRADERS, PAPER_EXACT, "finish", "generated_tokens", "generation", "prompt", "prompt_tokens",
               "prompt_ids", "model", "engine", "config_hash", "condition_hash", "problem_hash", "rank", "seconds",
               "error", "versions", "device", "dtype"]


def make_row(it: Item, cond: Condition, ids: list[int], text: str, finish: str, seconds: float, info: RunInfo,
         extract: str = "boxed", error: str | None = None, exact_on_prompt: bool = True,
         grade_timeout: int | None = GRADE_TIMEOUT, ungradable_wrong: bool = False) -> dict:
    p = it.problem
    shown = (it.prompt.text, len(it.prompt)) if it.prompt is not None else (None, None)  # None: not built
    exact: bool | None = None
    if finish not in ("nonfinite", "error"):
        try:  # the authors' verdict: on prompt + generation (MATH-500 script), or the generation alone (pass@3)
            exact = grade_paper_exact((it.prompt.text if exact_on_prompt else "") + text, p.answer)
        except PaperGraderError as err:  # their grader raises: their pass@3 loop counts it wrong, the others stop
            if ungradable_wrong:
                exact = False
            else:
                finish, error = "error", str(err)
    if finish in ("nonfinite", "error"):  # not an answer: no prediction, no verdict
        prediction, verdicts, exact = None, dict.fromkeys(GRADERS), None
    else:
        prediction = extract_answer(text, extract)
        verdicts = grade_all(prediction, p.answer, timeout=grade_timeout)
    return {
        "condition": cond.name, "problem_id": p.id, "sample": it.sample, "subject": p.subject,
        "level": p.level, "answer": p.answer, "prediction": prediction, **verdicts,
        PAPER_EXACT: exact, "finish": finish,
        "generated_tokens": len(ids), "generation": text, "prompt": shown[0],
        "prompt_tokens": shown[1], "prompt_ids": prompt_ids_digest(it.prompt) if it.prompt is not None else None,
        "model": info.model_name, "engine": info.engines.get(cond.name), "config_hash": info.run_hash,
        "condition_hash": info.condition_hashes[cond.name], "problem_hash": problem_hash(p), "rank": info.rank,
        "seconds": round(seconds, 4), "error": error,
        **{k: info.environment.get(k) for k in ("versions", "device", "dtype")},
    }


def _accuracy_postfix(tally: dict[str, list[int]]) -> str:
    parts = [f"{name} {k / n:.0%}" for name, (k, n) in tally.items() if n]
    return "acc " + " | ".join(parts) if parts else ""


def _progress(total: int, enabled: bool, rank: int, world_size: int):
    if not enabled or total == 0:
        return None
    desc = "eval" if world_size == 1 else f"eval shard {rank}/{world_size}"
    return tqdm(total=total, desc=desc, unit="problem", dynamic_ncols=True, position=rank if world_size > 1 else None)


def _generate(model, facts: ModelFacts, batch: list[Item], interventions: tuple, cond: Condition,
              config: EvalConfig, batch_size: int | None, emit, engine: str) -> None:
    """Generate the batch's answers with :func:`lensprobe.generate`, handing each to ``emit``
    as soon as its row has finished (continuous batching with ``batch_size`` rows live).

    Greedy: one row per prompt. Sampling: all ``n_samples`` rows of each distinct problem in
    the batch are drawn and the items' own samples picked out. ``emit`` gets the wall time
    since the previous row finished (the rows' times add up to the call's).
    """
    prompts: list[Any] = []
    first: dict[str, int] = {}
    for it in batch:
        if it.problem.id not in first:
            first[it.problem.id] = len(prompts)
            prompts.append(it.prompt)
    n = config.n_samples if config.do_sample else 1
    wanted = {first[it.problem.id] * n + (it.sample if config.do_sample else 0): it for it in batch}
    clock = [time.perf_counter()]

    def on_row(done: FinishedRow) -> None:
        it = wanted.get(done.row)
        if it is None:  # a sample already in the folder, drawn again with its problem's others
            return
        now = time.perf_counter()
        emit(it, cond, done.token_ids, done.text, done.finish_reason, done.error, now - clock[0])
        clock[0] = now

    settings = {**cond.generate_kwargs, "engine": engine_to_run(engine)}  # the engine its rows record
    generate(model, prompts, config.generation(), interventions=list(interventions), n_samples=n,
             batch_size=batch_size, on_row=on_row, on_error="row", facts=facts, **settings)
