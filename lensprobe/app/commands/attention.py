"""``lensprobe attention``: average attention received per position, with vs without filler (``--compare``)."""

from dataclasses import replace
from pathlib import Path

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
from lensprobe.core.progress import tqdm
from lensprobe.core.storage.jsonable import to_jsonable
from lensprobe.core.storage.store import atomic_file, atomic_write_json, atomic_write_text
from lensprobe.experiments.head_settings import HeadSelection
from lensprobe.studies import filler as fs
from lensprobe.studies.filler import FillerSetup
from lensprobe.studies.settings import AttentionConfig, heads_in_layers
from lensprobe.viz import attention_received_figure, attention_view_html


def add_attention(subparsers) -> None:
    """Register ``lensprobe attention``."""
    p = subparsers.add_parser("attention", **describe(
        "attention", help="average attention received per position, with vs without filler",
        description="Run a question with and without filler tokens and write, per layer, the average "
                    "attention each position receives (aligned and with the filler span shaded) as HTML "
                    "figures, a circuitsvis view, and the numbers as CSV/JSON. Layers and heads are "
                    "0-based (TransformerLens); papers count from 1."))
    add_inputs(p, ModelOptions, QuestionOptions, ComparedFillerOptions, FillerCountOptions, SystemOptions, HeadSelection,
               OutputOptions)
    add_config(p, FillerSetup, "filler_setup", prefix="filler-")  # --filler-seed, --filler-symbol, ...
    add_config(p, AttentionConfig, "config")
    p.set_defaults(func=run_attention)


def run_attention(args) -> int:
    args.QuestionOptions.one("attention")  # one question, before the model loads
    args.out = check_out_dir(out_of(args, "attention"), "attention")  # before the model loads
    compare = args.ComparedFillerOptions.compare
    conditions = ("w/o",) if compare == "w/o" else ("w/o", compare)
    setup = replace(args.filler_setup, conditions=conditions, system=system_of(args),
                    count=args.FillerCountOptions.filler_count)
    with writing_out_dir(args.out, "attention") as files:
        return _attention(args, setup, files)


def _attention(args, setup: FillerSetup, files: list[Path]) -> int:
    model = load_cli_model(args)
    layers = args.config.layer_list(model)
    heads = heads_in_layers(model, args.HeadSelection.spec(), layers)
    question, compare = args.QuestionOptions.one("attention"), args.ComparedFillerOptions.compare
    res = fs.attention_received_by_condition(model, question, layers=layers, heads=heads, setup=setup, progress=True)
    out: Path = args.out
    shade = compare if compare != "w/o" else None
    view_cond = shade or "w/o"
    for layer in tqdm(layers, desc="figures", leave=False):
        fig = attention_received_figure(
            res.table, [(layer, h) for h in heads], shade_condition=shade or "w/ Mless",
            title=f"{res.model_name}: average attention received, layer {layer}")
        files.append(write_figure(fig, out / f"attention_received_L{layer}.html"))
        pattern = fs.attention_view_pattern(model, res.prompts[view_cond], layer)
        view = attention_view_html(pattern, res.prompts[view_cond].str_tokens, layer=layer,
                                   span=res.filler_span(view_cond))
        files.append(atomic_write_text(out / f"attention_view_L{layer}.html", (
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Layer {layer} attention</title></head><body>"
            f"{view}</body></html>")))
    csv = out / "attention_received.csv"
    with atomic_file(csv) as tmp:
        res.table.to_csv(tmp, index=False)
    summary = {
        "model": res.model_name, "question": question, "conditions": list(res.conditions),
        "layers": layers, "heads": heads, "indexing": "0-based layers and heads (L0H13 = papers' layer 1, head 14)",
        "filler_spans": {c: res.filler_span(c) for c in res.conditions}, "prompts": res.prompts_json(),
    }
    if shade:
        summary["heads_by_change"] = fs.heads_by_change(res, condition=shade).to_dict(orient="records")
    js = out / "attention_received.json"
    atomic_write_json(js, to_jsonable(summary))
    files += [csv, js]
    print_files(out, files)
    return 0
