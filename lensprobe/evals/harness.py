"""The evaluation harness: conditions x problems -> generated, graded, saved rows.

:func:`evaluate` builds each condition's prompt for each problem, generates answers with
continuous batching (KV cache, greedy by default; :mod:`lensprobe.evals.running`), extracts the last ``\\boxed{...}`` of the
generated text (or, with ``extract="last-number"``, its last number), grades it with every
grader, and appends one JSONL row per (condition, problem, sample) to the output folder as soon
as it is graded. Rerunning with the same folder skips finished rows; a folder holding another
configuration is refused.

**Sharding.** Under ``accelerate launch`` (or ``torchrun``, or ``mpirun``) every process
reads its rank and the number of processes from the environment (``RANK``/``WORLD_SIZE``,
or the MPI equivalents; :func:`lensprobe.core.shards.shard_info`), takes every
``world_size``-th problem starting at its rank (:func:`~lensprobe.core.shards.my_units`), and
writes its own ``results-rank{R}.jsonl``. Rank 0 then waits for the other shards and
returns the merged table. The result rows do not depend on the number of processes.

**Sampling.** With ``do_sample=True`` every problem gets ``n_samples`` answers; sample ``j``
is drawn from a generator seeded with ``(seed, j)`` (see :func:`lensprobe.generate`), so a
row never depends on which other problems shared its batch, on sharding, or on resuming,
and every condition sees the same random numbers (paired comparisons).

**Prompt formats.** ``prompt_format="chat"`` (the default) builds the built-in conditions in
the model's chat template with lensprobe's system prompt. ``prompt_format="paper"`` builds the
meaningless-tokens authors' string for ``w/o``, ``w/ Mless``, ``w/ Mful`` and ``random
sentence`` (no chat template, :data:`~lensprobe.core.prompts.PAPER_SYSTEM_PROMPT` + filler +
problem, tokenized as one string) and, for settings not given, generates as the authors do:
``max_new_tokens=2048`` and ``do_sample``/``temperature``/``top_p`` from the model's own
generation config (:func:`paper_generation_settings`). Conditions passed as objects are used
as they are. The format is recorded in ``config.json`` (only when it is not ``"chat"``, so
chat-format folders keep their configuration hash).

**ARM.** ``"ARM"`` and ``"<name>+ARM"`` attach the paper's ARM module
(:class:`~lensprobe.ARM`): ``evaluate(arm=...)``, or else the authors' preset for the model.
An ARM without a seed is given the run's ``seed`` (any intervention with the
``with_default_seed`` capability is), so the same seed gives the same rows. ARM computes its
statistics per row (the authors' one-problem-at-a-time semantics, batched), so ARM conditions
run with continuous batching like the others and each row equals its run alone; an
intervention that declares itself ``batch_dependent`` (e.g. ``lp.ARM(per_row=False)``) is
generated one problem at a time instead.

**Verdicts.** Every row holds the three graders of :data:`~lensprobe.evals.grading.GRADERS` on
the extracted answer, and ``"paper-exact"``: the authors' own verdict,
:func:`~lensprobe.evals.grading.grade_paper_exact` on ``prompt text + generation``. Rows
written before that column existed read back with ``None`` in it.

**Broken generations.** A row whose generation met non-finite logits (NaN, ``+inf``, or only
``-inf``; see :func:`lensprobe.generate`) has ``finish="nonfinite"``, ``prediction=None`` and
``None`` in every verdict column: it is an error, neither right nor wrong, and the progress
bar's running accuracy leaves it out.

**Checks before the first batch.** Every condition's interventions are built once on the
model (unknown heads such as ``L0H99``, unknown hook points, ablation positions beyond
prompt + ``max_new_tokens``) before any generation runs.
"""

import dataclasses
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lensprobe.core.conditions import (
    PROMPT_FORMATS,
    PromptFormat,
    paper_conditions,
    resolve_conditions,
)
from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks import with_default_seed
from lensprobe.core.jsonable import json_digest, stable_repr
from lensprobe.core.models import model_label
from lensprobe.core.shards import check_shard, model_fingerprint, my_units
from lensprobe.core.shards import shard_info as shard_info  # its old home: lensprobe.evals.harness.shard_info
from lensprobe.evals.benchmarks import resolve_benchmark
from lensprobe.evals.data import Problem
from lensprobe.evals.grading import check_extract
from lensprobe.evals.protocols import get_protocol
from lensprobe.evals.results import (
    prepare_folder,
    read_rows,
)
from lensprobe.evals.running import ErrorRowsWarning as ErrorRowsWarning  # lensprobe.evals exports it
from lensprobe.evals.running import RunInfo, finished_rows, plan_rows, result_table, run_plan, tally_rows
from lensprobe.evals.verdicts import default_grader, mark_default_grader
from lensprobe.generation.config import GenerationConfig
from lensprobe.interventions.arm import ARM
from lensprobe.interventions.arm_presets import PAPER_TABLE9, model_key

DEFAULT_CONDITIONS = "w/o,w/ Mless,w/ Mful"
FORMAT_VERSION = 1
PAPER_MAX_NEW_TOKENS = 2048


@dataclass(frozen=True)
class EvalConfig(GenerationConfig):
    """Generation settings of an evaluation run: a :class:`~lensprobe.GenerationConfig` plus a batch size.

    Attributes:
        max_new_tokens: generated tokens per answer at most (default 512).
        batch_size: prompts generated together (left-padded); does not change greedy results
            and is not part of the configuration hash.
        seed: base seed of sampling (default 0; used only with ``do_sample=True``).
        n_samples: answers per problem (needs ``do_sample=True`` when > 1; for pass@k).
        prompt_format: ``"chat"`` or ``"paper"``: how the built-in conditions build their
            prompts (see the module docs). Part of the configuration hash only when it is not
            ``"chat"``. The generation defaults of the paper format are applied by
            :func:`evaluate` when settings are passed as keywords, or by
            :meth:`EvalConfig.paper`.
        extract: how the answer is read from the generated text: ``"boxed"`` (the last
            ``\\boxed{...}``, default) or ``"last-number"`` (the last number, lm-eval's flexible
            extraction; :func:`~lensprobe.evals.grading.extract_last_number`). Part of the
            configuration hash only when it is not ``"boxed"``.
        protocol: one of the authors' protocols (:data:`~lensprobe.evals.protocols.PROTOCOLS`,
            e.g. ``"arm-math500"``), recorded in the configuration hash when set; its settings
            are applied by :func:`evaluate` and :meth:`EvalConfig.paper` (those given win).

    The other fields (``do_sample``, ``temperature``, ``top_p``, ``stop_at_eos``, ``thinking``,
    ``think_when``) are :class:`~lensprobe.GenerationConfig`'s.
    """

    max_new_tokens: int = 512
    seed: int = 0
    batch_size: int = 8
    prompt_format: PromptFormat = "chat"
    extract: str = "boxed"
    protocol: str | None = None

    @classmethod
    def paper(cls, model, **settings) -> "EvalConfig":
        """The authors' generation settings for ``model`` with ``prompt_format="paper"``;
        ``settings`` given here win (see :func:`paper_generation_settings`).

        Example:
            >>> cfg = EvalConfig.paper(model, batch_size=4)
            >>> cfg.max_new_tokens, cfg.prompt_format
            (2048, 'paper')
        """
        return cls(**with_format_defaults(model, {**settings, "prompt_format": "paper"}))

    def __post_init__(self) -> None:
        if self.prompt_format not in PROMPT_FORMATS:
            raise LensprobeError(f"unknown prompt_format {self.prompt_format!r}: use one of {PROMPT_FORMATS}.")
        check_extract(self.extract)
        if self.protocol is not None and get_protocol(self.protocol).settings["prompt_format"] != self.prompt_format:
            raise LensprobeError(f"protocol {self.protocol!r} uses prompt_format='paper', got {self.prompt_format!r}: "
                                 "drop prompt_format (the protocol sets it).")
        if not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size <= 0:
            raise LensprobeError(f"batch_size must be a positive integer, got {self.batch_size!r}.")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise LensprobeError(f"seed must be an integer, got {self.seed!r}.")
        super().__post_init__()
        if self.n_samples > 1 and not self.do_sample:
            raise LensprobeError(
                f"n_samples={self.n_samples} with greedy decoding gives {self.n_samples} identical "
                "answers: set do_sample=True (e.g. --sample) or n_samples=1."
            )

    def generation(self) -> GenerationConfig:
        """The settings :func:`lensprobe.generate` runs with (the seed only when sampling)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(GenerationConfig)}
        return GenerationConfig(**{**fields, "seed": self.seed if self.do_sample else None})

    def hashed(self) -> dict:
        """The settings that change results (everything but ``batch_size``)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "batch_size"}
        if self.prompt_format == "chat":  # absent by default: chat-format folders keep their hash
            d.pop("prompt_format")
        if self.extract == "boxed":  # absent by default: boxed-answer folders keep their hash
            d.pop("extract")
        if self.protocol is None:  # absent when unset: older folders keep their hash
            d.pop("protocol")
        if not self.do_sample:
            d.pop("temperature")
            d.pop("top_p")
            d.pop("top_k")
            d.pop("min_p")
        for name, neutral in (("top_k", 0), ("min_p", None), ("repetition_penalty", 1.0)):
            if name in d and d[name] == neutral:  # absent when neutral: older folders keep their hash
                d.pop(name)
        for name in ("thinking", "think_when", "eos_token_id"):  # absent when unset: older folders keep their hash
            value = d.pop(name)
            if value is not None:
                d[name] = stable_repr(value)
        return d


TRANSFORMERS4_TOP_K = 50
"""``transformers`` 4.x's ``top_k`` when a generation config leaves it unset (the authors' version)."""


def paper_generation_settings(model) -> dict:
    """How the authors generate: ``max_new_tokens=2048`` and the model's own generation config.

    Every setting of ``model.original_model.generation_config`` that changes the next-token
    distribution is taken (greedy when there is none): ``do_sample``, ``repetition_penalty``
    (greedy too) and, with sampling, ``temperature``, ``top_p``, ``top_k`` and ``min_p``. The
    authors ran ``transformers`` 4.x, whose ``generate`` applies ``top_k=50`` when the
    generation config leaves ``top_k`` unset: so does this (an explicit ``0`` or ``None`` in
    a config read by 4.x would also have meant 50 for ``None``; only ``0`` turns it off).

    Example:
        >>> paper_generation_settings(model)
        {'max_new_tokens': 2048, 'do_sample': False}
    """
    out: dict[str, Any] = {"max_new_tokens": PAPER_MAX_NEW_TOKENS, "do_sample": False}
    gen = getattr(getattr(model, "original_model", None), "generation_config", None)
    if gen is None:
        return out
    out["do_sample"] = bool(getattr(gen, "do_sample", False))
    penalty = getattr(gen, "repetition_penalty", None)
    if penalty not in (None, 1.0):
        out["repetition_penalty"] = float(penalty)
    if out["do_sample"]:
        for name in ("temperature", "top_p", "min_p"):
            value = getattr(gen, name, None)
            if value is not None:
                out[name] = float(value)
        top_k = getattr(gen, "top_k", None)
        out["top_k"] = TRANSFORMERS4_TOP_K if top_k is None else int(top_k)
    return out


def with_format_defaults(model, settings: dict) -> dict:
    """``settings`` with the defaults of the ``"paper"`` format (:func:`paper_generation_settings`)
    and of ``settings["protocol"]`` filled in; the settings given win.

    Example:
        >>> with_format_defaults(model, {"protocol": "arm-aime-pass3"})["n_samples"]
        20
    """
    name = settings.get("protocol")
    if name is None and settings.get("prompt_format") != "paper":
        return settings
    fixed = get_protocol(name).settings if name is not None else {}
    return {**paper_generation_settings(model), **fixed, **settings}


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
        if not isinstance(p.id, str) or not isinstance(p.problem, str) or not p.problem.strip():
            raise LensprobeError(f"problem {p.id!r}: its id must be a string and its problem non-empty text.")
        if not isinstance(p.answer, str) or not p.answer.strip():
            raise LensprobeError(f"problem {p.id!r}: its answer must be non-empty text, got "
                                 f"{type(p.answer).__name__} {p.answer!r}: e.g. Problem(..., answer=str(value)).")
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise LensprobeError(f"problem id {dup!r} appears twice; ids must be unique.")
    return problems


def evaluate(model, problems, conditions: Any = DEFAULT_CONDITIONS, *, out: str | os.PathLike | None = None,
             config: EvalConfig | None = None, model_name: str | None = None, resume: bool = True,
             progress: bool = True, rank: int | None = None, world_size: int | None = None,
             wait_for_shards: bool = True, arm: Any = None, benchmark: str | None = None, **settings):
    """Generate and grade answers for every condition x problem (x sample), resumably.

    Args:
        model: a TransformerLens model (e.g. ``lp.load_model()``).
        problems: :class:`~lensprobe.evals.data.Problem` list from :func:`load_math500`.
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
            return the merged table.
        arm: the ARM that ``"ARM"`` and ``"<name>+ARM"`` conditions attach (e.g.
            ``lp.ARM(c=0.1, percentile=95)``); default: the authors' preset for the model on
            ``benchmark``.
        benchmark: the problems' benchmark (``"math500"``, ``"aime2024"``, ``"aime2025"`` ...),
            which picks the ARM preset; default: inferred from lensprobe's built-in data
            (:func:`~lensprobe.evals.benchmarks.infer_benchmark`).

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
            no verdicts), an :class:`~lensprobe.evals.running.ErrorRowsWarning` says how many, and a resumed run tries
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
    if config.max_new_tokens >= int(model.cfg.n_ctx):
        raise LensprobeError(
            f"max_new_tokens={config.max_new_tokens} leaves no room for a prompt in the model's context of "
            f"{int(model.cfg.n_ctx)} tokens: lower max_new_tokens."
        )
    system = {"system": get_protocol(config.protocol).system} if config.protocol else {}
    builtins = paper_conditions(prompt_format=config.prompt_format, **system) if config.prompt_format != "chat" else None
    conds = resolve_conditions(conditions, builtins=builtins,
                               arm=arm if arm is not None else (lambda: preset_arm(model, bench)))
    conds = [dataclasses.replace(c, interventions=with_default_seed(c.interventions, config.seed)) for c in conds]
    rank, world_size = check_shard(rank, world_size, out)
    fingerprint = model_fingerprint(model, model_name)
    run = {"format": FORMAT_VERSION, "model": fingerprint, "generation": config.hashed()}
    cond_desc = {}
    for c in conds:
        desc = c.describe(model)
        cond_desc[c.name] = {**desc, "hash": json_digest(desc)}
    info = RunInfo(fingerprint["name"], json_digest(run), {n: d["hash"] for n, d in cond_desc.items()}, rank)
    done: dict[tuple, dict] = {}
    if out is not None:
        out = prepare_folder(out, run, info.run_hash, cond_desc, resume=resume or rank != 0)
        done = finished_rows(out, problems)

    mine = my_units(problems, rank, world_size)
    plan = plan_rows(model, mine, conds, done, config)
    tally = tally_rows(done, mine, conds)
    new_rows = run_plan(model, plan, config, info, tally, out=out, progress=progress, world_size=world_size)
    grader = default_grader({"run": run})
    if out is None:
        return mark_default_grader(result_table(new_rows, conds, problems), grader)
    expected = {(c.name, p.id, s) for c in conds for p in problems for s in range(config.n_samples)}
    if world_size > 1 and rank == 0 and wait_for_shards:
        _wait_for(out, expected)
    rows = [r for r in read_rows(out) if (r["condition"], r["problem_id"], r["sample"]) in expected]
    return mark_default_grader(result_table(rows, conds, problems), grader)


def preset_arm(model, benchmark: str | None = "math500") -> ARM:
    """:meth:`ARM.preset` for ``model`` on ``benchmark``, its error saying how to pass an ARM to
    :func:`evaluate` (a thin wrapper; ``None``: the benchmark is unknown).

    Example:
        >>> preset_arm(model, "aime2024").c  # a Qwen2.5-Math-7B model
        0.05
    """
    if benchmark is None and model_key(model) in PAPER_TABLE9:
        raise LensprobeError("cannot tell which benchmark these problems are, so no ARM preset applies: pass "
                             "benchmark='math500' / 'aime2024' / 'aime2025' ... (--benchmark), or "
                             "arm=lp.ARM(c=0.1, percentile=95) (--arm-c, --arm-percentile).")
    try:
        return ARM.preset(model, benchmark or "math500")
    except LensprobeError as err:
        raise LensprobeError(
            f"no ARM preset for model {model_label(model)!r} ({err}) Choose c and percentile yourself and pass "
            "them, e.g. lp.evaluate(..., arm=lp.ARM(c=0.1, percentile=95)), or a condition "
            "lp.Condition('ARM', interventions=(lp.ARM(c=..., percentile=...),))."
        ) from None


def _wait_for(out: Path, expected: set[tuple], poll: float = 0.5, stall_timeout: float = 3600.0) -> None:
    """Wait until every expected row is in the folder (the other shards finished)."""
    last_count, last_change = -1, time.monotonic()
    while True:
        have = {(r["condition"], r["problem_id"], r["sample"]) for r in read_rows(out)}
        missing = expected - have
        if not missing:
            return
        if len(have) != last_count:
            last_count, last_change = len(have), time.monotonic()
        elif time.monotonic() - last_change > stall_timeout:
            warnings.warn(f"gave up waiting for {len(missing)} rows of other shards in {out}; "
                          "rerun the same command to finish them.", stacklevel=3)
            return
        time.sleep(poll)


