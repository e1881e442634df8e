"""The evaluation harness: conditions x problems -> generated, graded, saved rows.

:func:`evaluate` builds each condition's prompt for each problem, generates answers with
continuous batching (KV cache, greedy by default; :mod:`lensprobe.evals.running.execute`), extracts the last ``\\boxed{...}`` of the
generated text (or, with ``extract="last-number"``, its last number), grades it with every
grader, and appends one JSONL row per (condition, problem, sample) to the output folder as soon
as it is graded. Rerunning with the same folder skips finished rows; a folder holding another
configuration is refused.

**Sharding.** Under ``accelerate launch`` (or ``torchrun``, or ``mpirun``) every process
reads its rank and the number of processes from the environment (``RANK``/``WORLD_SIZE``,
or the MPI equivalents; :func:`lensprobe.core.storage.shards.shard_info`), takes every
``world_size``-th problem starting at its rank (:func:`~lensprobe.core.storage.shards.my_units`), and
writes its own ``results-rank{R}.jsonl``. Rank 0 then waits for the other shards and
returns the merged table; when no row reaches the folder for an hour
(:data:`~lensprobe.core.storage.store.STALL_TIMEOUT`) it stops with an error naming the ranks and
problems missing (:func:`~lensprobe.evals.results.folder.wait_for_rows`, the results store's one wait):
every row written stays, and rerunning the same command finishes the others. The result rows do
not depend on the number of processes.

**Sampling.** With ``do_sample=True`` every problem gets ``n_samples`` answers; sample ``j``
is drawn from a generator seeded with ``(seed, j)`` (see :func:`lensprobe.generate`), so a
row never depends on which other problems shared its batch, on sharding, or on resuming,
and every condition sees the same random numbers (paired comparisons).

**Prompt formats.** ``prompt_format="chat"`` (the default) builds the built-in conditions in
the model's chat template with lensprobe's system prompt. ``prompt_format="paper"`` builds the
meaningless-tokens authors' string for ``w/o``, ``w/ Mless``, ``w/ Mful`` and ``random
sentence`` (no chat template, :data:`~lensprobe.core.prompts.prompt.PAPER_SYSTEM_PROMPT` + filler +
problem, tokenized as one string) and, for settings not given, generates as the authors do:
``max_new_tokens=2048`` and ``do_sample``/``temperature``/``top_p`` from the model's own
generation config (:func:`paper_generation_settings`). Conditions passed as objects are used
as they are. The format is recorded in ``config.json`` with every other setting.

**Identity.** A folder is one run: its ``config.json`` holds the run's identity by content
(:mod:`lensprobe.core.storage.identity`: the model's weights, every setting, defaults and
``batch_size`` included, each condition's prompt template by text and token ids, its
interventions and generation settings by value, and the engine that runs it, ``"hf"`` or
``"bridge"``, resolved from ``"auto"``) and a hash of it; a run of another identity is refused,
and so is a folder written before identities were by content (its results cannot be checked
against this run's). Every row records its engine and a digest of its prompt's token ids; a
resumed run builds each finished row's prompt again and refuses a row whose token ids differ.

**ARM.** ``"ARM"`` and ``"<name>+ARM"`` attach the paper's ARM module
(:class:`~lensprobe.ARM`): ``evaluate(arm=...)``, or else the authors' preset for the model.
An ARM without a seed is given the run's ``seed`` (any intervention with the
``with_default_seed`` capability is), so the same seed gives the same rows. ARM computes its
statistics per row (the authors' one-problem-at-a-time semantics, batched), so ARM conditions
run with continuous batching like the others and each row equals its run alone; an
intervention that declares itself ``batch_dependent`` (e.g. ``lp.ARM(per_row=False)``) is
generated one problem at a time instead.

**Verdicts.** Every row holds the three graders of :data:`~lensprobe.evals.grading.grade.GRADERS` on
the extracted answer, and ``"paper-exact"``: the authors' own verdict,
:func:`~lensprobe.evals.grading.grade.grade_paper_exact` on ``prompt text + generation``. Rows
written before that column existed read back with ``None`` in it.

**Broken generations.** A row whose generation met non-finite logits (NaN, ``+inf``, or only
``-inf``; see :func:`lensprobe.generate`) has ``finish="nonfinite"``, ``prediction=None`` and
``None`` in every verdict column: it is an error, neither right nor wrong, and the progress
bar's running accuracy leaves it out.

**The model's facts.** Its tokenizer, context length, vocabulary, end ids, device, name and configuration
are read once at the start (:func:`~lensprobe.core.models.facts.model_facts`) and passed down to the planning
of rows, the generation and the ARM preset, which do not ask the model again.

**Checks before the first batch.** Every condition's interventions are built once on the
model (unknown heads such as ``L0H99``, unknown hook points, ablation positions beyond
prompt + ``max_new_tokens``) before any generation runs.
"""

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import with_default_seed
from lensprobe.core.models.facts import model_facts, run_environment
from lensprobe.core.prompts.conditions import (
    paper_conditions,
    resolve_conditions,
)
from lensprobe.core.prompts.text import blank, check_text
from lensprobe.core.storage.identity import IdentityError, identity_digest
from lensprobe.core.storage.jsonable import describe_setting
from lensprobe.core.storage.runconfig import run_hash
from lensprobe.core.storage.runidentity import run_identity
from lensprobe.core.storage.shards import check_shard, my_units
from lensprobe.core.storage.shards import (
    shard_info as shard_info,  # its old home: lensprobe.evals.running.harness.shard_info
)
from lensprobe.core.storage.writer import remove_empty_folder, remove_file
from lensprobe.evals.problems.benchmarks import resolve_benchmark
from lensprobe.evals.problems.load import Problem
from lensprobe.evals.results.folder import (
    CONFIG_FILE,
    EVAL_KIND,
    RESULTS_GLOB,
    prepare_folder,
    read_rows,
    wait_for_rows,
)
from lensprobe.evals.results.runfacts import mark_extract
from lensprobe.evals.results.verdicts import default_grader, mark_default_grader
from lensprobe.evals.running.config import EvalConfig, with_format_defaults
from lensprobe.evals.running.config import (
    paper_generation_settings as paper_generation_settings,  # its old home
)
from lensprobe.evals.running.execute import ErrorRowsWarning as ErrorRowsWarning  # lensprobe.evals exports it
from lensprobe.evals.running.execute import (
    RunInfo,
    check_done_prompts,
    condition_engine,
    finished_rows,
    plan_rows,
    result_table,
    run_plan,
    tally_rows,
)
from lensprobe.evals.running.protocols import arm_layer_defaults, get_protocol
from lensprobe.interventions.arm import ARM

DEFAULT_CONDITIONS = "w/o,w/ Mless,w/ Mful"
FORMAT_VERSION = 2  # 2: identities by content (lensprobe.core.storage.identity); folders of format 1 are refused
def _check_problems(problems) -> list[Problem]:
    if isinstance(problems, Problem):
        problems = [problems]
    problems = list(problems)
    if not problems:
        raise LensprobeError("no problems to evaluate: load some with lp.load_math500(path).")
    bad = [p for p in problems if not isinstance(p, Problem)]
    if bad:
        raise LensprobeError(
            f"problems must be lensprobe Problems (from lp.load_math500), got {type(bad[0]).__name__}."
        )
    for p in problems:  # before anything is generated: an answer that is not text fails at grading
        if not isinstance(p.id, str) or not isinstance(p.problem, str) or blank(p.problem):
            raise LensprobeError(f"problem {p.id!r}: its id must be a string and its problem non-empty text (not "
                                 "only spaces or invisible characters such as U+200B).")
        if not isinstance(p.answer, str) or blank(p.answer):
            raise LensprobeError(f"problem {p.id!r}: its answer must be non-empty text, got "
                                 f"{type(p.answer).__name__} {p.answer!r}: e.g. Problem(..., answer=str(value)).")
        for what, text in (("id", p.id), ("problem", p.problem), ("answer", p.answer)):
            check_text(text, f"problem {p.id!r}: its {what}")  # a lone surrogate fails only when its row is written
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise LensprobeError(f"problem id {dup!r} appears twice; ids must be unique.")
    return problems


def evaluate(model, problems, conditions: Any = DEFAULT_CONDITIONS, *, out: str | os.PathLike | None = None,
             config: EvalConfig | None = None, model_name: str | None = None, resume: bool = True,
             progress: bool = True, rank: int | None = None, world_size: int | None = None,
             wait_for_shards: bool = True, arm: Any = None, benchmark: str | None = None,
             arm_source: Literal["code", "paper"] = "code", **settings):
    """Generate and grade answers for every condition x problem (x sample), resumably.

    Args:
        model: a TransformerLens model (e.g. ``lp.load_model()``).
        problems: :class:`~lensprobe.evals.problems.load.Problem` list from :func:`load_math500`.
        conditions: names (``"w/o,w/ Mless,w/ Mful"``), :class:`Condition` objects or prompt
            builder callables; see :func:`resolve_conditions`.
        out: output folder (``config.json`` + ``results-rank*.jsonl``); ``None`` keeps rows
            in memory only (no resuming).
        config: an :class:`EvalConfig`; or pass its fields as keyword arguments
            (``max_new_tokens=256, batch_size=4``). With ``prompt_format="paper"`` or a
            ``protocol`` (``"arm-math500"``, ``"arm-aime-pass3"``) as a keyword, the settings not
            given follow :func:`paper_generation_settings` and the protocol.
        model_name: name recorded in rows and the configuration (default: the model's).
        resume: skip rows already in ``out``; ``False`` refuses a folder holding results.
        progress: show a progress bar (problems per second, running accuracy).
        rank, world_size: this process's shard; default from the environment (see
            :func:`shard_info`).
        wait_for_shards: on rank 0 of a sharded run, wait for the other shards' rows and
            return the merged table (an error names the ranks when they stall; see above).
        arm: the ARM that ``"ARM"`` and ``"<name>+ARM"`` conditions attach (e.g.
            ``lp.ARM(c=0.1, percentile=95)``); default: the authors' preset for the model on
            ``benchmark`` from ``arm_source``, the model recognised by its configuration
            (:func:`~lensprobe.interventions.arm_presets.model_key`) (under a protocol whose ``arm`` is ``"layer-defaults"``,
            such as ``"arm-aime-pass3"``, the authors' decoder-layer defaults).
        arm_source: where that preset comes from: ``"code"`` (the authors' released code, default) or
            ``"paper"`` (Table 9 and the paper's text); see
            :data:`~lensprobe.interventions.arm_presets.DISAGREEMENTS`. The ARM's settings and source are
            recorded with its condition in ``config.json`` (``parts.<condition>.labels``).
        benchmark: the problems' benchmark (``"math500"``, ``"aime2024"``, ``"aime2025"`` ...),
            which picks the ARM preset; default: inferred from lensprobe's built-in data
            (:func:`~lensprobe.evals.problems.benchmarks.infer_benchmark`).

    Returns:
        A pandas DataFrame, one row per (condition, problem, sample), with the verdict of each
        grader in the columns ``"math-verify"``, ``"paper"``, ``"paper-lenient"`` and
        ``"paper-exact"`` (the authors' verdict on prompt + generation), the
        extracted ``prediction``, the ``generation`` text, the exact ``prompt``, ``finish``
        (``"eos"``, ``"length"``, ``"nonfinite"`` for a broken generation or ``"error"`` for a
        row that could not run, whose prediction and verdicts are ``None``), ``error`` (the
        reason, for error rows), ``seconds`` (wall time since the previous row finished: rows
        run together, so their times add up to the run's) and the hashes of the configuration
        and condition.

    Raises:
        LensprobeError: unknown condition names, bad settings (``max_new_tokens`` as long as
            the context), or an output folder of another configuration. A prompt that does not
            fit the context with ``max_new_tokens``, or a row whose forward fails, does not
            stop the run: it becomes an error row (``finish="error"``, the reason in ``error``,
            no verdicts), an :class:`~lensprobe.evals.running.execute.ErrorRowsWarning` says how many, and a resumed run tries
            it again. A ``KeyboardInterrupt`` stops the run; every finished row is on disk.

    Example:
        >>> probs = lp.load_math500("test.jsonl", levels=1, limit=20)
        >>> rows = lp.evaluate(model, probs, "w/o,w/ Mless,w/ Mful", out="runs/smol",
        ...                    max_new_tokens=256)
        >>> lp.evals.accuracy(rows, "condition")
    """
    if config is not None and settings:
        raise LensprobeError("pass either config=EvalConfig(...) or keyword settings, not both.")
    if config is None:
        config = EvalConfig(**with_format_defaults(model, settings))
    problems = _check_problems(problems)
    bench = resolve_benchmark(benchmark, problems)
    facts = model_facts(model)  # once per run: every level below takes these, not the model's cfg and tokenizer
    if config.max_new_tokens >= facts.n_ctx:
        raise LensprobeError(
            f"max_new_tokens={config.max_new_tokens} leaves no room for a prompt in the model's context of "
            f"{facts.n_ctx} tokens: lower max_new_tokens."
        )
    system: dict[str, Any] = {"system": get_protocol(config.protocol).system} if config.protocol else {}
    builtins = paper_conditions(prompt_format=config.prompt_format, **system) if config.prompt_format != "chat" else None
    if arm_source not in ("code", "paper"):
        raise LensprobeError(f"arm_source must be 'code' (the released code) or 'paper' (Table 9), got {arm_source!r}.")
    layer_defaults = arm_layer_defaults(config.protocol)
    conds = resolve_conditions(conditions, builtins=builtins, arm=arm if arm is not None else (
        lambda: ARM.preset(facts, bench, source=arm_source, layer_defaults=layer_defaults)))
    conds = [dataclasses.replace(c, interventions=with_default_seed(c.interventions, config.seed)) for c in conds]
    rank, world_size = check_shard(rank, world_size, out)
    name = str(model_name) if model_name is not None else facts.name
    run, cond_desc = _identities(model, conds, config, out)
    info = RunInfo(name, run_hash(EVAL_KIND, run) if "identity" in run else None,
                   {n: d["hash"] for n, d in cond_desc.items()}, rank, {n: d["engine"] for n, d in cond_desc.items()},
                   run_environment(model))
    done: dict[tuple, dict] = {}
    with _nothing_left_if_refused(out, world_size):  # checks after the folder is prepared: intervention positions
        if out is not None:
            prepare_folder(out, run, cond_desc, resume=resume or rank != 0, labels={"model": name})
            out = Path(out).expanduser()
            done = finished_rows(out, problems)
            check_done_prompts(model, conds, done, problems, out)
        mine = my_units(problems, rank, world_size)
        plan = plan_rows(model, mine, conds, done, config, facts)
        tally = tally_rows(done, mine, conds)
        new_rows = run_plan(model, plan, config, info, tally, out=out, progress=progress, world_size=world_size,
                            facts=facts)
    grader = default_grader({"settings": run})
    if out is None:
        return mark_extract(mark_default_grader(result_table(new_rows, conds, problems), grader), config.extract)
    expected = {(c.name, p.id, s) for c in conds for p in problems for s in range(config.n_samples)}
    if world_size > 1 and rank == 0 and wait_for_shards:
        wait_for_rows(out, expected, [p.id for p in problems], world_size)
    rows = [r for r in read_rows(out) if (r["condition"], r["problem_id"], r["sample"]) in expected]
    return mark_extract(mark_default_grader(result_table(rows, conds, problems), grader), config.extract)


def _labels(condition) -> dict:
    """What a condition's interventions are, every field shown (an ARM's ``source`` too, which its identity
    leaves out): a label for people beside the identity, never compared."""
    return {"interventions": [describe_setting(i, structured=(type(i),)) for i in condition.interventions]}


def _identities(model, conds, config: EvalConfig, out) -> tuple[dict, dict[str, dict]]:
    """The run's identity and each condition's (with its ``"hash"``), by content; the model's name is a label
    beside them. A run kept in memory (``out=None``) resumes nothing: when something it depends on cannot be
    identified it runs without an identity (``None`` hashes), where a resumable run is refused."""
    try:
        run = {"format": FORMAT_VERSION, **run_identity(model, generation=config)}
        conditions = {}
        for c in conds:
            desc = {**c.describe(model), "engine": condition_engine(model, c)}
            conditions[c.name] = {**desc, "hash": identity_digest(desc), "labels": _labels(c)}
        return run, conditions
    except IdentityError:
        if out is not None:
            raise
    generation = {"prompt_format": config.prompt_format, "protocol": config.protocol}  # what default_grader reads
    return {"format": FORMAT_VERSION, "generation": generation}, {
        c.name: {"hash": None, "engine": condition_engine(model, c)} for c in conds}


@contextlib.contextmanager
def _nothing_left_if_refused(out, world_size: int) -> Iterator[None]:
    """A run that fails before its first row leaves nothing in a folder it started: its ``config.json``,
    empty results files and (when this run created it) the folder are removed. A single process only:
    the ranks of a sharded run share the folder."""
    folder = Path(out).expanduser() if out is not None else None
    fresh = folder is not None and world_size == 1 and not (folder / CONFIG_FILE).exists()
    existed = folder is not None and folder.exists()
    try:
        yield
    except BaseException:
        if folder is not None and fresh and folder.is_dir():
            with contextlib.suppress(OSError):  # never hide the reason the run failed
                if not any(p.stat().st_size for p in folder.glob(RESULTS_GLOB)):
                    for path in [*folder.glob(RESULTS_GLOB), folder / CONFIG_FILE]:
                        remove_file(folder, path)
                    if not existed:
                        remove_empty_folder(folder)  # stays when something else is in it
        raise
