"""``lensprobe ablate`` and ``lensprobe sweep``: head ablation on one question, and every head one at a time."""


from lensprobe.app.common import (
    add_inputs,
    check_out_dir,
    load_cli_model,
    out_of,
    system_of,
    write_figure,
    writing_out_dir,
)
from lensprobe.app.examples import describe
from lensprobe.app.option_groups import (
    AnswerOptions,
    FillerOptions,
    ModelOptions,
    OutputOptions,
    QuestionOptions,
    ReferenceOptions,
    SystemOptions,
)
from lensprobe.app.parsing import add_config
from lensprobe.app.sections.filler import demo_question
from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.heads import head_label, resolve_heads
from lensprobe.core.measures.measure import resolve_measure
from lensprobe.core.models.loading import model_label
from lensprobe.core.prompts.prompt import prompt_json
from lensprobe.core.storage.jsonable import to_jsonable
from lensprobe.core.storage.shards import bind_local_gpu, shard_info
from lensprobe.core.storage.store import atomic_file, atomic_write_json
from lensprobe.experiments.head_settings import (
    AblateConfig,
    AblationBatch,
    AblationSettings,
    HeadSelection,
    MetricSettings,
)
from lensprobe.experiments.sweep import ablation_sweep
from lensprobe.interventions.ablation import ablate_heads
from lensprobe.studies.filler import FillerSetup, attention_received_by_condition
from lensprobe.studies.heads import ablation_effect
from lensprobe.viz import head_attention_figure, next_token_figure, sweep_heatmap

PROMPT_INPUTS = (SystemOptions, FillerOptions, AblationSettings, ReferenceOptions, OutputOptions)
"""The prompt, ablation, reference and output options ``ablate``, ``sweep``, ``attribute`` and ``find-heads``
share."""


def prompt_of(model, args, question: str):
    """The prompt of ``question`` under the ``--filler`` condition and ``--system`` prompt."""
    return FillerSetup(system=system_of(args)).condition(args.FillerOptions.filler).prompt_builder(model)(question)


def check_reference(args) -> None:
    """A mean or resample ablation needs ``--reference`` (before the model loads)."""
    ablation = args.AblationSettings.ablation
    if ablation != "zero" and not args.ReferenceOptions.reference:
        raise LensprobeError(
            f"--ablation {ablation} needs --reference TEXT: a question whose head outputs are "
            + ("averaged (repeat --reference for several)." if ablation == "mean" else "copied in.")
        )


def reference_of(model, args):
    """The ``--reference`` prompts of a mean or resample ablation (``None`` when none is given)."""
    if not args.ReferenceOptions.reference:
        return None
    refs = [prompt_of(model, args, q) for q in args.ReferenceOptions.reference]
    return refs[0] if args.AblationSettings.ablation == "resample" and len(refs) == 1 else refs


def add_ablate(subparsers) -> None:
    """Register ``lensprobe ablate``."""
    p = subparsers.add_parser("ablate", **describe(
        "ablate", help="ablate attention heads: next-token entropy and logit change, attention figures",
        description="Ablate heads at blocks.{l}.attn.hook_z (per query head, GQA-correct) on one question and "
                    "write the next-token entropy and logit change (JSON/CSV, a bar chart) and, per ablated "
                    "head, its average attention per token position. Heads are 0-based: L0H13 is the papers' "
                    "layer 1, head 14."))
    add_inputs(p, ModelOptions, QuestionOptions, HeadSelection, *PROMPT_INPUTS)
    add_config(p, AblateConfig, "config")
    p.set_defaults(func=run_ablate_command)


def run_ablate_command(args) -> int:
    args.QuestionOptions.one("ablate")
    if args.HeadSelection.heads is None:
        raise LensprobeError("ablate needs --heads: the heads to ablate, e.g. --heads L0H3,L1H2 (or all).")
    args.out = check_out_dir(out_of(args, "ablate"), "ablate")  # before the model loads
    check_reference(args)
    with writing_out_dir(args.out, "ablate") as files:
        return _ablate(args, files)


def _ablate(args, files: list) -> int:
    model = load_cli_model(args)
    config: AblateConfig = args.config
    vocab = int(model.cfg.d_vocab)
    if config.show_tokens > vocab:
        raise LensprobeError(f"--show-tokens {config.show_tokens} is more tokens than the model's vocabulary of "
                             f"{vocab}: give --show-tokens {vocab} or less.")
    question, filler, method = args.QuestionOptions.one("ablate"), args.FillerOptions.filler, args.AblationSettings.ablation
    prompt = prompt_of(model, args, question)
    abl = ablate_heads(args.HeadSelection.spec(), method=method, reference=reference_of(model, args),
                       positions=config.position_spec(), prompt=prompt)
    pairs = abl.resolve(model)
    effect = ablation_effect(model, prompt, abl, top_k=config.show_tokens)
    out = args.out
    files += [out / "ablation.json", out / "next_tokens.csv", out / "next_tokens.html"]
    atomic_write_json(files[0], to_jsonable({
        "model": model_label(model), "heads": [head_label(*hp) for hp in pairs], "method": method,
        "positions": config.positions, "filler": filler, "prompt": prompt_json(prompt), **effect.summary,
        "indexing": "0-based layers and heads (L0H13 = papers' layer 1, head 14)",
    }))
    with atomic_file(files[1]) as tmp:
        effect.tokens.to_csv(tmp, index=False)
    title = f"Next token, {args.HeadSelection.heads} {method}-ablated"
    write_figure(next_token_figure(effect, title=title), files[2])
    conditions = ("w/o",) if filler == "w/o" else ("w/o", filler)
    setup = FillerSetup(conditions=conditions, system=system_of(args))
    layers = sorted({lay for lay, _ in pairs})
    heads = sorted({h for _, h in pairs})
    recv = attention_received_by_condition(model, question, layers=layers, heads=heads, setup=setup)
    files.append(out / "head_attention.csv")
    with atomic_file(files[-1]) as tmp:
        recv.table.to_csv(tmp, index=False)
    for lay, h in pairs:
        path = out / f"attention_{head_label(lay, h)}.html"
        write_figure(head_attention_figure(recv, lay, h, title=f"Average attention on head {head_label(lay, h)}"),
                   path)
        files.append(path)
    print(f"entropy {effect.summary['entropy_clean']:.4f} -> {effect.summary['entropy_ablated']:.4f} nats "
          f"({effect.summary['entropy_change']:+.4f}); KL {effect.summary['kl']:.4g}; top token "
          f"{effect.summary['top_token_clean']!r} -> {effect.summary['top_token_ablated']!r}")
    print(f"wrote {len(files)} files to {out.resolve()}")
    return 0


def add_sweep(subparsers) -> None:
    """Register ``lensprobe sweep``."""
    p = subparsers.add_parser("sweep", **describe(
        "sweep", help="ablate every head one at a time: [layer, head] table of metric changes",
        description="Ablate each head on its own (batched: one forward serves --heads-per-forward heads) and write "
                    "the [layer, head] table of metric changes as CSV, a heatmap and a JSON summary. Heads "
                    "are 0-based: L0H13 is the papers' layer 1, head 14. Under `torchrun --nproc-per-node N -m "
                    "lensprobe sweep ...` each process sweeps its share of (question, batch of heads) units; they "
                    "meet in --out/shards, and a rerun resumes."))
    add_inputs(p, ModelOptions, QuestionOptions, AnswerOptions, HeadSelection, MetricSettings, AblationBatch,
               *PROMPT_INPUTS)
    p.set_defaults(func=run_sweep_command)


def run_sweep_command(args) -> int:
    args.out = check_out_dir(out_of(args, "sweep"), "sweep")  # before the model loads
    check_reference(args)
    metric = args.MetricSettings.metric
    if metric != "logit_diff":  # checked with its tokens once the model is loaded
        for answer in args.AnswerOptions.answer or [None]:
            resolve_measure(metric, answer=answer)
    rank, world = shard_info()  # under torchrun / accelerate launch: this process's share of the sweep
    with writing_out_dir(args.out, "sweep", rank=rank) as files:  # rank 0 writes the folder's files
        return _sweep(args, rank, world, files)


def _sweep(args, rank: int, world: int, files: list) -> int:
    shards = args.out / "shards" if world > 1 else None
    if shards is not None:
        bind_local_gpu()
    model = load_cli_model(args)
    heads = args.HeadSelection.spec()
    resolve_heads(model, heads)  # bad heads fail before any work
    questions = args.QuestionOptions.question or [demo_question()[0]]
    prompts = [prompt_of(model, args, q) for q in questions]
    given = args.AnswerOptions.answer
    answers = (given[0] if len(given) == 1 else given) if given else None
    res = ablation_sweep(model, prompts, args.MetricSettings.metric, heads=heads,
                         method=args.AblationSettings.ablation, batch_size=args.AblationBatch.heads_per_forward,
                         tokens=args.MetricSettings.token_pair(), reference=reference_of(model, args),
                         answers=answers, progress=not args.OutputOptions.no_progress, out=shards)
    if rank != 0:
        print(f"rank {rank} of {world}: its share of the sweep is in {(args.out / 'shards').resolve()}; rank 0 writes the table")
        return 0
    out = args.out
    csv = res.to_csv(out / "sweep.csv")
    files += [csv, csv.with_name(csv.stem + "_long.csv"), write_figure(sweep_heatmap(res), out / "sweep_heatmap.html")]
    files.append(atomic_write_json(out / "sweep.json", to_jsonable({
        "model": model_label(model), "metric": res.metric, "method": args.AblationSettings.ablation,
        "filler": args.FillerOptions.filler,
        "baseline": res.baseline.tolist(), "heads_swept": len(res.heads),
        "top_heads": res.top(10).to_dict(orient="records"), "prompts": [prompt_json(p) for p in prompts],
        "indexing": "0-based layers and heads (L0H13 = papers' layer 1, head 14)",
    })))
    top = res.top(5)
    print("largest changes: " + ", ".join(f"{r.label} {r.change:+.4g}" for r in top.itertuples()))
    print(f"wrote {csv.name}, {csv.stem}_long.csv, sweep_heatmap.html, sweep.json to {out.resolve()}")
    return 0
