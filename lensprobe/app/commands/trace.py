"""``lensprobe trace``: entropy and attention onto thinking tokens per generation step."""

import dataclasses
import re
from functools import partial
from pathlib import Path

from lensprobe.app.commands.heads import prompt_of
from lensprobe.app.common import (
    add_inputs,
    check_out_dir,
    load_cli_model,
    out_of,
    print_files,
    write_figure,
    writing_out_dir,
)
from lensprobe.app.examples import describe
from lensprobe.app.option_groups import (
    FillerOptions,
    ModelOptions,
    OutputOptions,
    QuestionOptions,
    SystemOptions,
)
from lensprobe.app.parsing import add_config
from lensprobe.core.models.loading import model_label
from lensprobe.core.storage.jsonable import prompt_ids_digest
from lensprobe.core.storage.runidentity import run_identity
from lensprobe.core.storage.shards import bind_local_gpu, shard_info
from lensprobe.core.storage.store import atomic_file
from lensprobe.generation.thinking.latent import LatentFusion, add_thinking_token
from lensprobe.generation.traces.sets import trace_jobs
from lensprobe.generation.traces.summary import trace_summary
from lensprobe.studies.settings import TraceConfig
from lensprobe.studies.thinking import compare_thinking, texts_table
from lensprobe.viz.lens import logit_lens
from lensprobe.viz.trace import generation_trace_figure


def add_trace(subparsers) -> None:
    """Register ``lensprobe trace``."""
    p = subparsers.add_parser("trace", **describe(
        "trace", help="trace entropy and attention onto thinking tokens per generation step",
        description="Generate from a question under one or more thinking settings (LatentFusion, Coconut, "
                    "Soft-Thinking, pause tokens, none) with a KV cache, recording per step the next-token "
                    "entropy and the attention proportion from the newest query onto the thinking positions "
                    "(and other tracked sets), per layer and head. Writes one trace file per setting, the "
                    "per-step summary as CSV and the two-panel figure as HTML. Step 0 is the last prompt "
                    "position. --filler builds the prompt with a filler (its share of the attention is traced too). "
                    "Layers and heads are 0-based. Under `torchrun --nproc-per-node N -m lensprobe "
                    "trace ...` each process traces its share of the settings; they meet in --out/shards."))
    add_inputs(p, ModelOptions, QuestionOptions, SystemOptions, FillerOptions, OutputOptions)
    add_config(p, TraceConfig, "config")
    add_config(p, LatentFusion, "fusion", prefix="fusion-")
    p.set_defaults(func=run_trace)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "trace"


def _identity_part(value):
    """A configuration object as its fields (``format`` and ``smooth`` change no trace), else the value."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return value
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.name not in ("format", "smooth")}


def _trace_setting(model, prompt, label: str, thinking, generation: dict, record: list[str], lens=None):
    """The trace of one thinking setting, as :func:`compare_thinking` makes it among several."""
    return compare_thinking(model, prompt, {label: thinking}, record=record or None, lens=lens, **generation)[label]


def run_trace(args) -> int:
    args.QuestionOptions.one("trace")  # one question, before the model loads
    args.out = check_out_dir(out_of(args, "trace"), "trace")  # before the model loads
    config: TraceConfig = args.config
    settings = config.settings(args.fusion)
    rank, world = shard_info()  # under torchrun / accelerate launch: this process's share of the settings
    with writing_out_dir(args.out, "trace", rank=rank) as files:  # rank 0 writes the folder's files
        return _trace(args, settings, (rank, world), files)


def _trace(args, settings: dict, shard: tuple[int, int], files: list) -> int:
    rank, world = shard
    if world > 1:
        bind_local_gpu()
    model = load_cli_model(args)
    token = args.fusion.token
    if any(t is not None for t in settings.values()):
        ids = model.tokenizer.encode(token, add_special_tokens=False)
        if not (len(ids) == 1 and model.tokenizer.decode(ids) == token):
            add_thinking_token(model, token)  # this process owns the model
    question = args.QuestionOptions.one("trace")
    prompt = prompt_of(model, args, question)  # under --filler (w/o: no filler)
    config: TraceConfig = args.config
    generation = config.generation()
    if "filler" in prompt.segments:  # the filler's share of the attention is traced too
        generation["track"] = {**generation["track"], "filler": "filler"}
    track = generation["track"]
    record = config.recorded()
    lens = "logit" if config.lens == "logit" else None
    if world == 1:
        traces = compare_thinking(model, prompt, settings, **generation, progress=True, record=record or None,
                                  lens=lens)
    else:  # one unit per setting: the same traces as compare_thinking's, whatever the number of processes
        jobs = {label: partial(_trace_setting, model, prompt, label, t, generation, record, lens)
                for label, t in settings.items()}
        given = {k: _identity_part(v) for k, v in vars(args).items() if k not in ("func", "out", "OutputOptions")}
        described = run_identity(model, prompt=prompt, arguments=given)
        traces = trace_jobs(jobs, out=args.out / "shards", settings=described, progress="trace",
                            ids=dict.fromkeys(jobs, prompt_ids_digest(prompt)))
        if rank != 0:
            print(f"rank {rank} of {world}: its traces are in {(args.out / 'shards').resolve()}; rank 0 writes the "
                  "summary")
            return 0
    out: Path = args.out
    for label, tr in traces.items():
        files.append(tr.save(out / f"trace-{_slug(label)}.{config.format}"))
    summary = trace_summary(traces, track="thinking" if any(t is not None for t in settings.values()) else
                            next(iter(track), None), band="std", smooth=config.smooth)
    texts = texts_table(traces, max_chars=100_000)
    for table, name in ((summary, "summary.csv"), (texts, "texts.csv")):
        files.append(out / name)
        with atomic_file(files[-1]) as tmp:
            table.to_csv(tmp, index=False)
    band = f"band: ± 1 std across {config.n_samples} samples" if config.n_samples > 1 else None
    fig = generation_trace_figure(summary, title=f"{model_label(model)}: {question[:60]}", band_label=band)
    fig_path = out / "trace.html"
    write_figure(fig, fig_path)
    files.append(fig_path)
    for label, tr in traces.items() if lens else ():
        files.append(out / f"lens-{_slug(label)}.html")
        write_figure(logit_lens(tr, row=0, title=f"Logit lens, {label}: each layer's entropy"), files[-1])
    print_files(out, files)
    for label, tr in traces.items():
        print(f"{label}: {tr.lengths[0]} steps, {int(tr.thinking_rows[0].sum())} thinking, "
              f"mean entropy {float(tr.entropy_rows.nanmean()):.3f} nats"
              + (f", {len(tr.activations_rows)} hook points recorded per step" if tr.activations_rows else "")
              + (f", the logit lens of {len(tr.lens.layers)} layers" if tr.lens is not None else ""))
    return 0
