"""``lensprobe attention``: average attention received per position, with vs without filler."""

from pathlib import Path

from tqdm.auto import tqdm

from lensprobe.app.common import (
    add_model_argument,
    add_system_arguments,
    check_out_dir,
    filler_condition,
    load_cli_model,
    print_files,
    system_of,
    write_figure,
    writing_out_dir,
)
from lensprobe.app.option_groups import FILLER_OPTIONS, OutputOptions, QuestionOptions, SiteOptions
from lensprobe.app.options import Option, add_options, option_values
from lensprobe.core.jsonable import to_jsonable
from lensprobe.core.models import check_heads, check_layers
from lensprobe.core.store import atomic_file, atomic_write_json, atomic_write_text
from lensprobe.studies import filler as fs
from lensprobe.studies.filler import FillerSetup
from lensprobe.viz import attention_received_figure, attention_view_html

FILLER_CHOICES = ("w/ Mless", "w/ Mful", "random sentence", "w/o")
"""``--filler``: the condition compared with ``w/o`` (older spellings: meaningless, meaningful, random, none)."""


def add_attention(subparsers) -> None:
    """Register ``lensprobe attention``."""
    p = subparsers.add_parser(
        "attention", help="average attention received per position, with vs without filler",
        description="Run a question with and without filler tokens and write, per layer, the average "
                    "attention each position receives (aligned and with the filler span shaded) as HTML "
                    "figures, a circuitsvis view, and the numbers as CSV/JSON. Layers and heads are "
                    "0-based (TransformerLens); papers count from 1.")
    add_model_argument(p)
    add_options(p, QuestionOptions)
    p.add_argument("--filler", default="w/ Mless", type=filler_condition(FILLER_CHOICES), metavar="CONDITION",
                   help="filler condition compared with no filler: 'w/ Mless' ('/' x 55; the default), 'w/ Mful' "
                        "('he' x 55), 'random sentence', or 'w/o' (no filler only); also meaningless, meaningful, "
                        "random, none")
    add_system_arguments(p)
    add_options(p, FillerSetup, FILLER_OPTIONS)
    add_options(p, SiteOptions)
    add_options(p, OutputOptions, ["out"], out=Option(default=Path("lensprobe-attention")))
    p.set_defaults(func=run_attention)


def run_attention(args) -> int:
    check_out_dir(args.out, "attention")  # before the model loads
    conditions = ("w/o",) if args.filler == "w/o" else ("w/o", args.filler)
    setup = FillerSetup(conditions=conditions, system=system_of(args), **option_values(args, FillerSetup, FILLER_OPTIONS))
    with writing_out_dir(args.out, "attention") as files:
        return _attention(args, setup, files)


def _attention(args, setup: FillerSetup, files: list[Path]) -> int:
    model = load_cli_model(args)
    layers = check_layers(model, args.layers)
    heads = check_heads(model, args.heads)
    res = fs.attention_received(model, args.question, layers=layers, heads=heads, setup=setup, progress=True)
    out: Path = args.out
    shade = args.filler if args.filler != "w/o" else None
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
        "model": res.model_name, "question": args.question, "conditions": list(res.conditions),
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
