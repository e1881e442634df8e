"""``lensprobe attribute``: estimate every head's ablation effect (AtP, AtP*), then verify the top ones exactly."""


from lensprobe.app.checks import positive_int, text
from lensprobe.app.commands.heads import FILLER_CHOICES, prompt_of
from lensprobe.app.common import (
    add_model_argument,
    add_system_arguments,
    check_out_dir,
    filler_condition,
    load_cli_model,
    write_figure,
    writing_out_dir,
)
from lensprobe.app.option_groups import OutputOptions
from lensprobe.app.options import Option, add_options
from lensprobe.app.sections.filler import demo_question
from lensprobe.core.errors import LensprobeError
from lensprobe.core.heads import parse_heads, resolve_heads
from lensprobe.core.jsonable import to_jsonable
from lensprobe.core.models import model_label
from lensprobe.core.prompts import prompt_json
from lensprobe.core.store import atomic_file, atomic_write_json
from lensprobe.evals.data import load_math500
from lensprobe.interventions.attribution import attribute_heads
from lensprobe.interventions.verify import verify_attribution
from lensprobe.viz import attribution_heatmap, attribution_scatter

METRICS = ("entropy", "logprob", "logit_diff")


def add_attribute(subparsers) -> None:
    """Register ``lensprobe attribute``."""
    p = subparsers.add_parser(
        "attribute", help="estimate every head's ablation effect in a few passes (AtP, AtP*), verify the top ones",
        description="Attribution patching: the change of a metric when each head is ablated at hook_z (as "
                    "`lensprobe ablate` does), estimated for every head from a forward and a backward pass "
                    "(atp), or with the QK fix and GradDrop of AtP* (atp*); then --verify K heads with the "
                    "largest scores are ablated exactly. Writes attribution.csv, attribution_heatmap.html, "
                    "verification.csv, attribution_scatter.html and attribution.json. Heads are 0-based: L0H13 "
                    "is the papers' layer 1, head 14.")
    p.add_argument("--metric", default="entropy", choices=METRICS,
                   help="entropy (next-token, last position) | logprob (needs --answer) | logit_diff (needs --tokens)")
    p.add_argument("--method", default="atp*", choices=("atp", "atp*"), help="attribution method (default atp*)")
    p.add_argument("--ablation", default="zero", choices=("zero", "mean", "resample"), help="ablation (default zero)")
    p.add_argument("--reference", action="append", default=None, metavar="TEXT",
                   help="a reference question for --ablation mean (repeat for several) or resample (once)")
    p.add_argument("--question", action="append", default=None, metavar="TEXT", type=text,
                   help="a question (repeat for several; default: a level-1 MATH-500 problem)")
    p.add_argument("--math500", type=positive_int, default=None, metavar="N",
                   help="use N MATH-500 problems (seeded draw) instead of --question")
    p.add_argument("--answer", action="append", default=None, metavar="TEXT",
                   help="the answer for --metric logprob (one, or one per question)")
    p.add_argument("--tokens", default=None, metavar="A,B", help="the two tokens of --metric logit_diff (ids or text)")
    p.add_argument("--heads", default="all", help="heads to attribute (default all), e.g. L0H0,L0H1 or H3")
    p.add_argument("--unit", default="head", choices=("head", "kv"), help="one row per query head or per KV group")
    p.add_argument("--verify", type=int, default=20, metavar="K", help="verify the K top heads exactly (0: none)")
    p.add_argument("--sample", type=int, default=0, metavar="M", help="and M other heads drawn at random")
    p.add_argument("--batch-size", type=positive_int, default=32, help="rows per batched forward (default 32)")
    add_model_argument(p)
    add_system_arguments(p)
    p.add_argument("--filler", default="w/o", type=filler_condition(FILLER_CHOICES), metavar="CONDITION",
                   help="filler between system prompt and question: 'w/o' (default), 'w/ Mless' or 'w/ Mful'")
    add_options(p, OutputOptions, ["out"], out=Option(required=True))
    p.set_defaults(func=run_attribute_command)


def _tokens(spec: str | None):
    if spec is None:
        return None
    parts = [s for s in spec.split(",")]
    if len(parts) != 2:
        raise LensprobeError(f"--tokens takes two tokens separated by a comma (e.g. 7,8 or ' 7',' 8'), got {spec!r}.")
    return tuple(int(s) if s.strip().isdigit() else s for s in parts)


def _check(args) -> None:
    """Argument errors before the model loads."""
    check_out_dir(args.out, "attribution")
    parse_heads(args.heads)
    if args.metric == "logprob" and not args.answer:
        raise LensprobeError("--metric logprob needs --answer TEXT.")
    if args.metric == "logit_diff" and not args.tokens:
        raise LensprobeError("--metric logit_diff needs --tokens A,B.")
    if args.verify < 0 or args.sample < 0:
        raise LensprobeError("--verify and --sample take a count >= 0.")
    if args.ablation != "zero" and not args.reference:
        raise LensprobeError(f"--ablation {args.ablation} needs --reference TEXT.")
    if args.math500 and args.question:
        raise LensprobeError("pass --question or --math500, not both.")


def run_attribute_command(args) -> int:
    _check(args)
    tokens = _tokens(args.tokens)
    with writing_out_dir(args.out, "attribute") as files:
        return _attribute(args, tokens, files)


def _attribute(args, tokens, files: list) -> int:
    model = load_cli_model(args)
    resolve_heads(model, args.heads)
    if args.math500:
        questions = [p.problem for p in load_math500(limit=args.math500, seed=0)]
    else:
        questions = args.question or [demo_question()[0]]
    prompts = [prompt_of(model, args, q) for q in questions]
    refs = [prompt_of(model, args, q) for q in args.reference or []]
    reference = (refs[0] if args.ablation == "resample" and len(refs) == 1 else refs) or None
    answers = None if not args.answer else (args.answer[0] if len(args.answer) == 1 else args.answer)
    att = attribute_heads(model, prompts, args.metric, method=args.method, ablation=args.ablation, reference=reference,
                          heads=args.heads, unit=args.unit, answers=answers, tokens=tokens, batch_size=args.batch_size)
    out = args.out
    files += [att.to_csv(out / "attribution.csv"), write_figure(attribution_heatmap(att), out / "attribution_heatmap.html")]
    summary = {"model": model_label(model), "metric": att.metric, "method": args.method, "ablation": args.ablation,
               "unit": args.unit, "filler": args.filler, "metric_values": att.values.tolist(),
               "top": att.top(10).to_dict(orient="records"), "prompts": [prompt_json(p) for p in prompts],
               "indexing": "0-based layers and heads (L0H13 = papers' layer 1, head 14)"}
    print("top estimates: " + ", ".join(f"{r.head_label} {r.estimate:+.4g}" for r in att.top(5).itertuples()))
    if args.verify:
        ver = verify_attribution(model, prompts, args.metric, att, top=min(args.verify, len(att.units)),
                                 sample=args.sample, batch_size=args.batch_size)
        files.append(out / "verification.csv")
        with atomic_file(files[-1]) as tmp:
            ver.table.to_csv(tmp, index=False)
        files.append(write_figure(attribution_scatter(ver), out / "attribution_scatter.html"))
        summary["verification"] = {"top": ver.top, "spearman": ver.spearman, "spearman_abs": ver.spearman_abs,
                                   "recall": ver.recall, "misses": ver.misses.to_dict(orient="records")}
        print(ver.summary())
    files.append(atomic_write_json(out / "attribution.json", to_jsonable(summary)))
    print(f"wrote the attribution to {out.resolve()}")
    return 0
