"""Trace sets: many generation traces, one per prompt (or per named job), sharded over processes.

:func:`trace_prompts` runs :func:`~lensprobe.generation.loop.trace_generation` once per prompt,
so a prompt's trace never depends on which other prompts were traced, in which process, or in
which run. With ``out=folder`` every trace is saved as Parquet (``traces/trace-00000.parquet``,
written atomically) as soon as it is done, a rerun skips the traces on disk, and under a
launcher (``torchrun``, ``accelerate launch``, ``srun``) the prompts are spread over the
processes (see :mod:`lensprobe.core.storage.shards`): rank ``r`` traces every ``world_size``-th prompt
from prompt ``r``, and rank 0 waits for the others and returns the whole set.

:func:`trace_jobs` is the same machinery for any named jobs that each return a trace (the
``lensprobe trace`` command uses it for one question under several thinking settings).

Example:
    >>> traces = lp.generation.trace_prompts(model, [p1, p2, p3], max_new_tokens=64, out="runs/traces")
    >>> traces[0].entropy                       # prompt 0's trace
    >>> lp.generation.load_trace("runs/traces/traces/trace-00001.parquet")  # prompt 1's, from disk
"""

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.forward import as_prompts
from lensprobe.core.models.facts import ModelFacts, model_facts
from lensprobe.core.models.loading import check_layers
from lensprobe.core.storage.files import file_sha256
from lensprobe.core.storage.jsonable import prompt_ids_digest
from lensprobe.core.storage.runidentity import run_identity
from lensprobe.core.storage.shards import run_sharded
from lensprobe.core.storage.store import atomic_file
from lensprobe.generation.config import GenerationConfig, generation_config
from lensprobe.generation.engines.choose import engine_name
from lensprobe.generation.loop import trace_generation
from lensprobe.generation.recording import recorded_hook_names
from lensprobe.generation.thinking.latent import LatentFusion
from lensprobe.generation.traces.activations import as_records, resolve_names
from lensprobe.generation.traces.trace import GenerationTrace, load_trace

__all__ = ["TRACE_FOLDER", "trace_engine", "trace_jobs", "trace_prompts"]

TRACE_FOLDER = "traces"
"""Subfolder of ``out`` that holds the trace files."""


def trace_jobs(jobs: Mapping[str, Callable[[], GenerationTrace]], *, out: str | os.PathLike | None = None,
               settings: Mapping[str, Any] | None = None, rank: int | None = None, world_size: int | None = None,
               progress: bool | str = False, ids: Mapping[str, str] | None = None,
               engine: str | None = None) -> dict[str, GenerationTrace]:
    """Run named jobs that each return a :class:`~lensprobe.generation.GenerationTrace`, sharded and resumable.

    Args:
        jobs: name -> a function of no arguments returning one trace; run in this order.
        out: a folder where every trace is saved as soon as it is done (Parquet, under
            ``traces/``) and the processes of a sharded run meet (on a filesystem they all
            share); a rerun skips the jobs on disk. ``None``: traces stay in memory.
        settings: JSON-able description of everything the traces depend on (the model, the
            prompts, the generation settings); a folder of other settings is refused.
        rank, world_size: this process's shard; default from the environment
            (:func:`~lensprobe.core.storage.shards.shard_info`). With ``world_size > 1``, ``out`` is required.
        progress: a progress bar over the jobs this process runs (a string: its label).
        ids: job -> the digest of the token ids it traces
            (:func:`~lensprobe.core.storage.jsonable.prompt_ids_digest`), recorded in its row and
            checked when the run resumes.
        engine: the engine the jobs run on, resolved (``"hf"``, ``"bridge"``, ``"hooked"``: never
            ``"auto"``), recorded in ``config.json``'s parts; a job whose trace ran on another engine
            is refused. Every row records the engine its trace ran on (``trace.meta["engine"]``) and the
            SHA-256 of its trace file, checked before the file is read.

    Returns:
        Name -> trace, in the order of ``jobs``: every job on rank 0 (and when not sharded),
        this rank's jobs on the others. With ``out``, every trace is read back from its file,
        so the result is the same whether it was computed now, earlier or by another process.

    Raises:
        LensprobeError: no jobs, names that are not strings, a sharded run without ``out``,
            a folder of another run, or other ranks that stop finishing jobs.

    Example:
        >>> trace_jobs({"a": lambda: lp.trace_generation(model, p, max_new_tokens=8)}, out="runs/t")
    """
    names = list(jobs)
    if not names:
        raise LensprobeError("no traces to run: pass at least one prompt or job.")
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise LensprobeError(f"job names must be strings, got {bad[0]!r}: name each job with a string.")
    label = progress if isinstance(progress, str) else "traces"
    if out is None:
        return run_sharded(names, lambda n: jobs[n](), out=None, kind="trace set", settings={}, rank=rank,
                           world_size=world_size, progress=label if progress else False)
    folder = Path(out).expanduser()
    files = {n: f"{TRACE_FOLDER}/trace-{i:05d}.parquet" for i, n in enumerate(names)}

    def compute(name: str) -> dict[str, str]:
        trace = jobs[name]()
        ran = str(trace.meta.get("engine"))
        if engine is not None and ran != engine:
            raise LensprobeError(f"trace {name!r} ran on engine {ran!r}, but the trace set records {engine!r}: "
                                 "pass engine='bridge' or 'hf' to trace_prompts to choose one.")
        with atomic_file(folder / files[name]) as tmp:
            trace.save(tmp)
        return {"file": files[name], "engine": ran, "sha256": file_sha256(folder / files[name], "trace file")}

    settings = {**(settings or {}), "jobs": names}
    parts = None if engine is None else {"engine": {"name": engine, "hash": engine}}
    saved = run_sharded(names, compute, out=folder, kind="trace set", settings=settings, rank=rank,
                        world_size=world_size, progress=label if progress else False, ids=ids, parts=parts)
    return {name: _checked_trace(folder, row) for name, row in saved.items()}


def _checked_trace(folder: Path, row: dict[str, str]) -> GenerationTrace:
    """The trace a row names, its whole file checked against the SHA-256 the row records."""
    path = folder / row["file"]
    got = file_sha256(path, "trace file")
    if got != row["sha256"]:
        raise LensprobeError(f"{path} is not the trace its row recorded (SHA-256 {got[:16]}..., recorded "
                             f"{row['sha256'][:16]}...): it was edited or replaced. Delete it and its row (or the "
                             "folder) to trace it again.")
    return load_trace(path)


def trace_prompts(model, prompts, config: GenerationConfig | None = None, *, out: str | os.PathLike | None = None,
                  rank: int | None = None, world_size: int | None = None, progress: bool = False,
                  track: Any = None, interventions: Sequence = (), layers: Any = None, engine: str = "auto",
                  record: Any = None, lens: Any = None, lens_top_k: int = 5, lens_layers: Any = None,
                  **settings) -> dict[int | str, GenerationTrace]:
    """Trace every prompt on its own with :func:`~lensprobe.generation.loop.trace_generation`.

    Args:
        model: a TransformerLens model.
        prompts: a list of prompts (:class:`~lensprobe.Prompt`, token ids, or question strings,
            built with the chat template), or ``{name: prompt}``.
        config, track, interventions, layers, engine, record, lens, lens_top_k, lens_layers, **settings: as in
            :func:`~lensprobe.trace_generation`, the same for every prompt
            (``max_new_tokens=64, do_sample=True, seed=0, n_samples=4, ...``).
        out: a folder where every trace is saved as Parquet as soon as it is done; a rerun
            skips the prompts on disk, and the processes of a sharded run meet there (on a
            filesystem they all share). A folder of another model, other prompts or other
            settings is refused. ``None`` (default): nothing is saved.
        rank, world_size: this process's shard; default from the environment
            (``RANK``/``WORLD_SIZE`` under ``torchrun`` or ``accelerate launch``). Rank ``r``
            traces every ``world_size``-th prompt from prompt ``r``; with ``world_size > 1``,
            ``out`` is required.
        progress: a progress bar over the prompts this process traces.

    Returns:
        Prompt index (or name, for a mapping) -> its :class:`~lensprobe.generation.GenerationTrace`. In a
        sharded run, rank 0 waits for the other processes and returns every prompt's trace,
        equal to a single-process run; the other ranks return their own prompts' traces.
        With ``out``, traces are read back from their files (see :func:`trace_jobs`).

    Raises:
        LensprobeError: no prompts, bad generation settings (checked before any forward), a
            sharded run without ``out``, or a folder of another run.

    Example:
        >>> traces = lp.generation.trace_prompts(model, {"easy": p1, "hard": p2}, max_new_tokens=128,
        ...                           track={"system": "system"}, out="runs/traces")
        >>> traces["hard"].attention["system"].shape      # [step, layer, head]
    """
    cfg = generation_config(config, settings)
    facts = model_facts(model)  # once for every prompt's trace
    if isinstance(prompts, Mapping):
        keys = list(prompts)
        if any(not isinstance(k, str) for k in keys):
            raise LensprobeError("prompt names must be strings: pass {'name': prompt, ...} or a list of prompts.")
        items = [_one_prompt(facts, prompts[k], k) for k in keys]
    else:
        items = as_prompts(facts, prompts, build_strings=True)
        keys = list(range(len(items)))
    by_name = dict(zip(map(str, keys), items, strict=True))

    def job(name: str) -> Callable[[], GenerationTrace]:
        return lambda: _trace_one(model, facts, by_name[name], cfg, track, interventions, layers, engine, record,
                                  lensing)

    lensing = {} if lens is None else {"lens": lens, "lens_top_k": lens_top_k, "lens_layers": lens_layers}
    described = None if out is None else run_identity(
        model, prompts=items, generation=cfg, track=track, interventions=list(interventions), layers=layers,
        engine=engine, record=as_records(record), **lensing)
    ids = {name: prompt_ids_digest(item) for name, item in by_name.items()}
    ran = None if out is None else trace_engine(model, cfg, interventions, layers, engine, record)
    traces = trace_jobs({name: job(name) for name in by_name}, out=out, settings=described, rank=rank,
                        world_size=world_size, progress="trace set" if progress else False, ids=ids, engine=ran)
    return {key: traces[str(key)] for key in keys if str(key) in traces}


def trace_engine(model, cfg: GenerationConfig, interventions: Sequence = (), layers: Any = None,
                 engine: str = "auto", record: Any = None) -> str:
    """The engine a trace of these settings runs on, ``"auto"`` resolved (what a trace set records).

    Example:
        >>> trace_engine(model, lp.GenerationConfig(max_new_tokens=8))
        'hf'
    """
    names = recorded_hook_names(model, check_layers(model, layers), isinstance(cfg.thinking, LatentFusion))
    names += [name for name, _ in resolve_names(model, as_records(record))]
    return engine_name(model, engine, interventions=list(interventions), hook_names=names)


def _trace_one(model, facts: ModelFacts, prompt, cfg: GenerationConfig, track, interventions, layers, engine,
               record, lensing: dict) -> GenerationTrace:
    return trace_generation(model, prompt, cfg, track=track, interventions=interventions, layers=layers,
                            engine=engine, facts=facts, record=record, **lensing)


def _one_prompt(facts: ModelFacts, prompt, name: str):
    items = as_prompts(facts, prompt, build_strings=True)
    if len(items) != 1:
        raise LensprobeError(f"prompt {name!r} holds {len(items)} prompts: give one prompt per name.")
    return items[0]
