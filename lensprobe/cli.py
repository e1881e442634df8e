"""The ``lensprobe`` command.

Each subcommand is registered by a small ``_add_<name>(subparsers)`` function listed in
:data:`SUBCOMMANDS`; it sets ``func`` to a function ``(args) -> int`` that calls the
library. Errors of lensprobe (:class:`~lensprobe.errors.LensprobeError`) print one line on
stderr and exit with code 2; so does bad command-line input.

Examples:
    lensprobe attention --question "What is 12+7?" --filler meaningless --layers 0 --heads 0,1,7 --out attn
    lensprobe demo --out lensprobe-report
"""

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def int_list(text: str) -> list[int]:
    """Parse ``"0,1,7"`` (or ``"3"``) into ints, for ``--layers``/``--heads``."""
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 0,1,7, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer, e.g. 0")
    return values


def layer_list(text: str) -> list[int] | None:
    """Like :func:`int_list`, and ``"all"`` for every layer (``None``)."""
    return None if text.strip().lower() == "all" else int_list(text)


def _print_files(out: Path, files: Sequence[Path]) -> None:
    print(f"wrote {len(files)} files to {out.resolve()}:")
    for f in files:
        print(f"  {f.name}")


# ---------------------------------------------------------------------------------------
# lensprobe attention

FILLER_CHOICES = ("meaningless", "meaningful", "random", "none")


def _add_attention(subparsers) -> None:
    from lensprobe.prompts import MATH_SYSTEM_PROMPT, PLACEMENTS

    p = subparsers.add_parser(
        "attention", help="average attention received per position, with vs without filler",
        description="Run a question with and without filler tokens and write, per layer, the average "
                    "attention each position receives (aligned and with the filler span shaded) as HTML "
                    "figures, a circuitsvis view, and the numbers as CSV/JSON. Layers and heads are "
                    "0-based (TransformerLens); papers count from 1.")
    p.add_argument("--model", default=None, help="model path (.gguf or HF folder) or hub name; "
                                                 "default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--question", required=True, help="the question text")
    p.add_argument("--filler", default="meaningless", choices=FILLER_CHOICES,
                   help="filler condition compared with no filler (default: meaningless, '/' x 55)")
    p.add_argument("--count", type=int, default=55, help="filler repetitions (default 55)")
    p.add_argument("--system", default=MATH_SYSTEM_PROMPT, help="system prompt (default: the paper's MATH prompt)")
    p.add_argument("--no-system", action="store_true", help="no system prompt")
    p.add_argument("--placement", default="between", choices=PLACEMENTS, help="where the filler goes")
    p.add_argument("--layers", type=layer_list, default=[0], help="0-based layers, e.g. 0 or 0,5,29 or all")
    p.add_argument("--heads", type=int_list, default=None, help="0-based heads, e.g. 0,1,7 (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random sentence")
    p.add_argument("--out", type=Path, default=Path("lensprobe-attention"), help="output folder")
    p.set_defaults(func=_run_attention)


def _run_attention(args) -> int:
    import json

    from tqdm.auto import tqdm

    from lensprobe import filler_study as fs
    from lensprobe.models import check_heads, check_layers, load_model
    from lensprobe.report import to_jsonable
    from lensprobe.viz import attention_received_figure, attention_view_html

    conditions = ("none",) if args.filler == "none" else ("none", args.filler)
    setup = fs.FillerSetup(conditions=conditions, system=None if args.no_system else args.system,
                           count=args.count, seed=args.seed, placement=args.placement)
    with tqdm(total=1, desc="loading model", leave=False) as bar:
        model = load_model(args.model)
        bar.update()
    layers = check_layers(model, args.layers)
    heads = check_heads(model, args.heads)
    res = fs.attention_received(model, args.question, layers=layers, heads=heads, setup=setup, progress=True)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    shade = args.filler if args.filler != "none" else None
    view_cond = shade or "none"
    for layer in tqdm(layers, desc="figures", leave=False):
        fig = attention_received_figure(
            res.table, [(layer, h) for h in heads], shade_condition=shade or "meaningless",
            title=f"{res.model_name}: average attention received, layer {layer}")
        path = out / f"attention_received_L{layer}.html"
        fig.write_html(path, include_plotlyjs="directory", full_html=True)  # plotly.min.js once, beside it
        files.append(path)
        pattern = fs.attention_view_pattern(model, res.prompts[view_cond], layer)
        view = attention_view_html(pattern, res.prompts[view_cond].str_tokens, layer=layer,
                                   span=res.filler_span(view_cond))
        path = out / f"attention_view_L{layer}.html"
        path.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Layer {layer} attention"
                        f"</title></head><body>{view}</body></html>", encoding="utf-8")
        files.append(path)
    csv = out / "attention_received.csv"
    res.table.to_csv(csv, index=False)
    summary = {
        "model": res.model_name, "question": args.question, "conditions": list(res.conditions),
        "layers": layers, "heads": heads, "indexing": "0-based layers and heads (L0H13 = papers' layer 1, head 14)",
        "filler_spans": {c: res.filler_span(c) for c in res.conditions}, "prompts": res.prompts_json(),
    }
    if shade:
        summary["heads_by_change"] = fs.heads_by_change(res, condition=shade).to_dict(orient="records")
    js = out / "attention_received.json"
    js.write_text(json.dumps(to_jsonable(summary), indent=1), encoding="utf-8")
    files += [csv, js]
    if (out / "plotly.min.js").exists():
        files.append(out / "plotly.min.js")
    _print_files(out, files)
    return 0


# ---------------------------------------------------------------------------------------
# lensprobe demo


def _add_demo(subparsers) -> None:
    p = subparsers.add_parser("demo", help="write the demo report (embedded model, offline)",
                              description="Run every study on the embedded SmolLM2-135M-Instruct (or --model) "
                                          "and write a self-contained HTML report with the numbers as CSV/JSON.")
    p.add_argument("--out", type=Path, default=Path("lensprobe-report"), help="output folder (default lensprobe-report)")
    p.add_argument("--model", default=None, help="model path or hub name (default: the embedded model)")
    p.add_argument("--quick", action="store_true", help="tiny inputs: a fast smoke run")
    p.set_defaults(func=_run_demo)


def _run_demo(args) -> int:
    from lensprobe.demo import run_demo

    index = run_demo(args.out, args.model, quick=args.quick)
    print(f"report written to {index.resolve()}")
    return 0


# ---------------------------------------------------------------------------------------

from lensprobe.evals.cli import add_eval as _add_eval  # noqa: E402
from lensprobe.evals.cli import add_eval_report as _add_eval_report  # noqa: E402
from lensprobe.head_study import add_ablate_command as _add_ablate  # noqa: E402
from lensprobe.head_study import add_sweep_command as _add_sweep  # noqa: E402
from lensprobe.thinking_study import add_trace as _add_trace  # noqa: E402

SUBCOMMANDS: list[Callable] = [
    _add_attention,
    _add_demo,
    _add_eval,
    _add_eval_report,
    _add_trace,
    _add_ablate,
    _add_sweep,
]
"""Functions that register one subcommand each; add yours here."""


def build_parser() -> argparse.ArgumentParser:
    from lensprobe import __version__

    parser = argparse.ArgumentParser(
        prog="lensprobe",
        description="Attention, entropy and intervention studies on TransformerLens models. "
                    "Layers and heads are 0-based (TransformerLens); papers count from 1.")
    parser.add_argument("--version", action="version", version=f"lensprobe {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lensprobe`` console script; returns the exit code."""
    from lensprobe.errors import LensprobeError

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # bad arguments (code 2) or --help/--version (code 0)
        return int(exc.code or 0)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except LensprobeError as err:
        print(f"lensprobe: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lensprobe: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
