"""``lensprobe sinks``: attention on the first token (and the filler) and massive activations, per condition,
over the prompt and per generation step."""

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from lensprobe.app.common import (
    add_inputs,
    check_out_dir,
    load_cli_model,
    out_of,
    print_files,
    system_of,
    write_figure,
    writing_out_dir,
)
from lensprobe.app.examples import describe
from lensprobe.app.option_groups import (
    ComparedFillerOptions,
    FillerCountOptions,
    ModelOptions,
    OutputOptions,
    QuestionOptions,
    SystemOptions,
)
from lensprobe.app.parsing import add_config
from lensprobe.app.sections.sinks import norm_traces, sink_figures, sink_summary, sink_tables
from lensprobe.core.checks import count
from lensprobe.core.given import given_settings
from lensprobe.core.prompts.prompt import prompt_json
from lensprobe.core.storage.jsonable import to_jsonable
from lensprobe.core.storage.store import atomic_file, atomic_write_json
from lensprobe.generation.config import MAX_NEW_TOKENS, GenerationConfig
from lensprobe.studies.filler import CONDITIONS, FillerSetup
from lensprobe.studies.sinks import SinkConfig, attention_sinks

STEPS = 32
"""Generation steps per condition when ``--max-new-tokens`` is not given."""

_Steps: Any = given_settings(GenerationConfig, "_Steps",
                             exclude=[f.name for f in fields(GenerationConfig) if f.name != "max_new_tokens"])


@dataclass(frozen=True)
class SinkSteps(_Steps):
    """How many tokens ``lensprobe sinks`` generates per condition (32 when not given).

    ``--max-new-tokens`` as :class:`~lensprobe.GenerationConfig` declares it (``None``: :data:`STEPS`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_new_tokens is not None:
            count("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS)


def add_sinks(subparsers) -> None:
    """Register ``lensprobe sinks``."""
    p = subparsers.add_parser("sinks", **describe(
        "sinks", help="attention sinks and massive activations, with vs without filler",
        description="Run a question without filler and with --compare (or --all-conditions) and write, per "
                    "layer and head, the attention each query puts on the first token (the attention sink) and "
                    "on the filler: over the prompt (mean over the queries after it, and per query) and from the "
                    "newest query at each greedy generation step (default 32; step 0 = the last prompt "
                    "position); and per layer the largest |entries| of the residual stream over the median "
                    "|entry| (massive activations), with their dimension and token, over the prompt and per "
                    "step. Tables as CSV, figures as HTML. Layers and heads are 0-based (TransformerLens); "
                    "papers count from 1."))
    add_inputs(p, ModelOptions, QuestionOptions, ComparedFillerOptions, FillerCountOptions, SystemOptions,
               OutputOptions)
    add_config(p, FillerSetup, "filler_setup", prefix="filler-")  # --filler-seed, --filler-symbol, ...
    add_config(p, SinkConfig, "config")
    add_config(p, SinkSteps, "steps")
    p.set_defaults(func=run_sinks)


def run_sinks(args) -> int:
    args.QuestionOptions.one("sinks")  # one question, before the model loads
    args.out = check_out_dir(out_of(args, "sinks"), "sinks")  # before the model loads
    with writing_out_dir(args.out, "sinks") as files:
        return _sinks(args, files)


def _conditions(args) -> tuple[str, ...]:
    if args.config.all_conditions:
        return CONDITIONS
    compare = args.ComparedFillerOptions.compare
    return ("w/o",) if compare == "w/o" else ("w/o", compare)


def _sinks(args, files: list[Path]) -> int:
    model = load_cli_model(args)
    config: SinkConfig = args.config
    steps = args.steps.max_new_tokens if args.steps.max_new_tokens is not None else STEPS
    question = args.QuestionOptions.one("sinks")
    setup = replace(args.filler_setup, count=args.FillerCountOptions.filler_count)
    segments = config.segment_names()
    result = attention_sinks(model, question, system=system_of(args), conditions=_conditions(args),
                             layers=config.layer_list(model), segments=segments if segments != ("filler",) else None,
                             max_new_tokens=steps, entries=config.entries, setup=setup,
                             progress=not args.OutputOptions.no_progress)
    traces = norm_traces(model, result, max_new_tokens=steps)
    out: Path = args.out
    for stem, table in sink_tables(result, queries=True).items():
        with atomic_file(out / f"{stem}.csv") as tmp:
            table.to_csv(tmp, index=False)
        files.append(out / f"{stem}.csv")
    for stem, fig in sink_figures(result, traces).items():
        files.append(write_figure(fig, out / f"{stem}.html"))
    meta = {"model": result.model_name, "question": question, "conditions": list(result.conditions),
            "layers": result.layers, "targets": list(result.targets), "max_new_tokens": steps,
            "entries": config.entries, "summary": sink_summary(result),
            "texts": {c: tr.texts[0] for c, tr in result.traces.items()},
            "step_0": "the last prompt position (its query predicts the first generated token)",
            "indexing": "0-based layers and heads (L0H13 = papers' layer 1, head 14)",
            "prompts": {c: prompt_json(p) for c, p in result.prompts.items()}}
    js = out / "sinks.json"
    atomic_write_json(js, to_jsonable(meta))
    files.append(js)
    print_files(out, files)
    return 0
