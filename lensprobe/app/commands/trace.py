"""``lensprobe trace``: entropy and attention onto thinking tokens per generation step."""

import re
from functools import partial
from pathlib import Path

from lensprobe.app.checks import (
    finite_number,
    positive_int,
    probability,
)
from lensprobe.app.common import (
    add_model_argument,
    add_system_arguments,
    check_out_dir,
    load_cli_model,
    print_files,
    system_of,
    write_figure,
    writing_out_dir,
)
from lensprobe.app.option_groups import GENERATION_OPTIONS, OutputOptions, QuestionOptions
from lensprobe.app.options import Option, add_options
from lensprobe.core.errors import LensprobeError
from lensprobe.core.identity import run_identity
from lensprobe.core.models import model_label
from lensprobe.core.prompts import build_prompt
from lensprobe.core.shards import bind_local_gpu, shard_info
from lensprobe.core.store import atomic_file
from lensprobe.generation.config import GenerationConfig
from lensprobe.generation.schedule import parse_schedule
from lensprobe.generation.thinking import LatentFusion, add_thinking_token
from lensprobe.generation.trace import trace_summary
from lensprobe.generation.traceset import trace_jobs
from lensprobe.studies.thinking import (
    SETTING_LABELS,
    THINKING_SETTINGS,
    compare_thinking,
    texts_table,
    thinking_setting,
)
from lensprobe.viz.trace import generation_trace_figure

LATENT_OPTIONS: dict[str, Option] = {
    "alpha": Option(type=finite_number, note="for --think fusion"),
    "top_p": Option(flag="--fusion-top-p", type=probability),
    "token": Option(help="the thinking token (added if missing)"),
}
"""The :class:`~lensprobe.LatentFusion` fields on the command line."""

TRACE_CHANGES: dict[str, Option] = {
    "max_new_tokens": Option(default=400),
    "n_samples": Option(flag="--samples", note="needs --sample for variety"),
    "seed": Option(default=0),
}
"""How ``lensprobe trace`` shows the :data:`~lensprobe.app.option_groups.GENERATION_OPTIONS`."""


def add_trace(subparsers) -> None:
    """Register ``lensprobe trace``."""
    p = subparsers.add_parser(
        "trace", help="trace entropy and attention onto thinking tokens per generation step",
        description="Generate from a question under one or more thinking settings (LatentFusion, Coconut, "
                    "Soft-Thinking, pause tokens, none) with a KV cache, recording per step the next-token "
                    "entropy and the attention proportion from the newest query onto the thinking positions "
                    "(and other tracked sets), per layer and head. Writes one trace file per setting, the "
                    "per-step summary as CSV and the two-panel figure as HTML. Step 0 is the last prompt "
                    "position. Layers and heads are 0-based. Under `torchrun --nproc-per-node N -m lensprobe "
                    "trace ...` each process traces its share of the settings; they meet in --out/shards.")
    add_model_argument(p)
    add_options(p, QuestionOptions)
    add_system_arguments(p)
    p.add_argument("--think", default="fusion",
                   help=f"thinking setting(s), comma-separated, from {','.join(THINKING_SETTINGS)} (default fusion)")
    p.add_argument("--schedule", default="every:8",
                   help="when to think: every:N, first:K, at:S1,S2, entropy:NATS, emitted (the model emits the "
                        "token), joined with '+' (default every:8)")
    add_options(p, LatentFusion, LATENT_OPTIONS)
    p.add_argument("--track", default="system,question",
                   help="extra tracked sets, comma-separated: segment names, 'prompt', 'generated', or one-token "
                        "strings (default system,question)")
    add_options(p, GenerationConfig, GENERATION_OPTIONS, title="generation (lp.GenerationConfig)", **TRACE_CHANGES)
    p.add_argument("--smooth", type=positive_int, default=1, help="moving-average window of the figure, in steps")
    p.add_argument("--format", default="parquet", choices=("parquet", "json"), help="trace file format")
    add_options(p, OutputOptions, ["out"], out=Option(default=Path("lensprobe-trace")))
    p.set_defaults(func=run_trace)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "trace"


def _trace_setting(model, prompt, label: str, thinking, generation: dict):
    """The trace of one thinking setting, as :func:`compare_thinking` makes it among several."""
    return compare_thinking(model, prompt, {label: thinking}, **generation)[label]


def run_trace(args) -> int:
    check_out_dir(args.out, "trace")  # before the model loads
    names = [s.strip() for s in args.think.split(",") if s.strip()]
    settings = {SETTING_LABELS.get(n, n): thinking_setting(n, alpha=args.alpha, top_p=args.fusion_top_p,
                                                           token=args.token) for n in names}
    if not settings:
        raise LensprobeError(f"--think needs at least one of {', '.join(THINKING_SETTINGS)}.")
    rule = parse_schedule(args.schedule)
    GenerationConfig(args.max_new_tokens, do_sample=args.sample, temperature=args.temperature, top_p=args.top_p,
                     n_samples=args.samples)  # sampling settings checked before the model loads
    track = {s.strip(): s.strip() for s in args.track.split(",") if s.strip()}
    rank, world = shard_info()  # under torchrun / accelerate launch: this process's share of the settings
    with writing_out_dir(args.out, "trace", rank=rank) as files:  # rank 0 writes the folder's files
        return _trace(args, settings, rule, track, (rank, world), files)


def _trace(args, settings: dict, rule, track: dict, shard: tuple[int, int], files: list) -> int:
    rank, world = shard
    if world > 1:
        bind_local_gpu()
    model = load_cli_model(args)
    if any(t is not None for t in settings.values()):
        ids = model.tokenizer.encode(args.token, add_special_tokens=False)
        if not (len(ids) == 1 and model.tokenizer.decode(ids) == args.token):
            add_thinking_token(model, args.token)  # this process owns the model
    prompt = build_prompt(model, args.question, system=system_of(args))
    generation = {"max_new_tokens": args.max_new_tokens, "think_when": rule, "track": track, "n_samples": args.samples,
                  "do_sample": args.sample, "temperature": args.temperature, "top_p": args.top_p,
                  "seed": args.seed if args.sample else None}
    if world == 1:
        traces = compare_thinking(model, prompt, settings, **generation, progress=True)
    else:  # one unit per setting: the same traces as compare_thinking's, whatever the number of processes
        jobs = {label: partial(_trace_setting, model, prompt, label, t, generation) for label, t in settings.items()}
        given = {k: v for k, v in vars(args).items() if k not in ("func", "out", "format", "smooth")}
        described = run_identity(model, prompt=prompt, arguments=given)
        traces = trace_jobs(jobs, out=args.out / "shards", settings=described, progress="trace")
        if rank != 0:
            print(f"rank {rank} of {world}: its traces are in {(args.out / 'shards').resolve()}; rank 0 writes the "
                  "summary")
            return 0
    out: Path = args.out
    for label, tr in traces.items():
        files.append(tr.save(out / f"trace-{_slug(label)}.{args.format}"))
    summary = trace_summary(traces, track="thinking" if any(t is not None for t in settings.values()) else
                            next(iter(track), None), band="std", smooth=args.smooth)
    texts = texts_table(traces, max_chars=100_000)
    for table, name in ((summary, "summary.csv"), (texts, "texts.csv")):
        files.append(out / name)
        with atomic_file(files[-1]) as tmp:
            table.to_csv(tmp, index=False)
    band = f"band: ± 1 std across {args.samples} samples" if args.samples > 1 else None
    fig = generation_trace_figure(summary, title=f"{model_label(model)}: {args.question[:60]}", band_label=band)
    fig_path = out / "trace.html"
    write_figure(fig, fig_path)
    files.append(fig_path)
    print_files(out, files)
    for label, tr in traces.items():
        print(f"{label}: {tr.lengths[0]} steps, {int(tr.thinking_rows[0].sum())} thinking, "
              f"mean entropy {float(tr.entropy_rows.nanmean()):.3f} nats")
    return 0
