"""``lensprobe attribute``: estimate every head's ablation effect (AtP, AtP*), then verify the top ones exactly;
``lensprobe find-heads``: the exact top heads at a fraction of the sweep's cost."""


from typing import Any

from lensprobe.app.commands.heads import PROMPT_INPUTS, check_reference, prompt_of, reference_of
from lensprobe.app.common import (
    add_inputs,
    check_out_dir,
    load_cli_model,
    out_of,
    write_figure,
    writing_out_dir,
)
from lensprobe.app.examples import describe
from lensprobe.app.option_groups import AnswerOptions, Math500Options, ModelOptions, QuestionOptions
from lensprobe.app.parsing import add_config, setting_message
from lensprobe.app.sections.filler import demo_question
from lensprobe.core.errors import LensprobeError, SettingError
from lensprobe.core.hooks.heads import resolve_heads
from lensprobe.core.models.loading import model_label
from lensprobe.core.prompts.prompt import prompt_json
from lensprobe.core.storage.jsonable import to_jsonable
from lensprobe.core.storage.store import atomic_file, atomic_write_json
from lensprobe.evals.problems.load import load_math500
from lensprobe.experiments.attribution import attribute_heads
from lensprobe.experiments.findheads import find_heads
from lensprobe.experiments.head_settings import (
    AblationBatch,
    AttributionConfig,
    FindHeadsConfig,
    HeadSelection,
    MetricSettings,
    RecallCheck,
)
from lensprobe.experiments.verify import verify_attribution
from lensprobe.viz import attribution_heatmap, attribution_scatter, find_heads_heatmap, find_heads_scatter


def add_attribute(subparsers) -> None:
    """Register ``lensprobe attribute``."""
    p = subparsers.add_parser("attribute", **describe(
        "attribute", help="estimate every head's ablation effect in a few passes (AtP, AtP*), verify the top ones",
        description="Attribution patching: the change of a metric when each head is ablated at hook_z (as "
                    "`lensprobe ablate` does), estimated for every head from a forward and a backward pass "
                    "(atp), or with the QK fix and GradDrop of AtP* (atp*); then --verify K heads with the "
                    "largest scores are ablated exactly. Writes attribution.csv, attribution_heatmap.html, "
                    "verification.csv, attribution_scatter.html and attribution.json. Heads are 0-based: L0H13 "
                    "is the papers' layer 1, head 14."))
    add_inputs(p, ModelOptions, QuestionOptions, AnswerOptions, Math500Options, HeadSelection, MetricSettings, AblationBatch,
               RecallCheck, *PROMPT_INPUTS)
    add_config(p, AttributionConfig, "config")
    p.set_defaults(func=run_attribute_command)


def add_find_heads(subparsers) -> None:
    """Register ``lensprobe find-heads``."""
    p = subparsers.add_parser("find-heads", **describe(
        "find-heads", help="the exact top heads by ablation effect, at a fraction of the sweep's cost",
        description="The heads whose ablation at hook_z changes a metric most, each ablated exactly, found without "
                    "ablating every head (lp.find_heads): AtP estimates every head, heads with a large write to "
                    "the residual stream are ablated exactly, the others in AtP's order until a step adds nothing to "
                    "the exact top, over the questions and then per question, and a random sample of the rest "
                    "checks what was missed; when that would cost as much as ablating every head, it ablates every "
                    "head instead and says so. Writes find_heads.csv, per_prompt.csv, find_heads_scatter.html, "
                    "find_heads_heatmap.html and find_heads.json. Heads are 0-based: L0H13 is the papers' layer 1, "
                    "head 14."))
    add_inputs(p, ModelOptions, QuestionOptions, AnswerOptions, Math500Options, MetricSettings, AblationBatch, RecallCheck,
               *PROMPT_INPUTS)
    add_config(p, FindHeadsConfig, "config")
    p.set_defaults(func=run_find_heads_command)


def _check(args, command: str, kind: str) -> None:
    """Argument errors before the model loads (``kind``: what the output folder holds)."""
    args.out = check_out_dir(out_of(args, command), kind)
    metric, answer = args.MetricSettings.metric, args.AnswerOptions.answer
    try:
        args.MetricSettings.check_gradient()
    except SettingError as err:  # named as the option that sets it
        raise LensprobeError(setting_message(err) + ".") from None
    if args.Math500Options.math500 and answer:
        raise LensprobeError("--math500 problems carry their answers (--metric logprob reads them): drop --answer, "
                             "or give the questions with --question and their answers with --answer.")
    if metric == "logprob" and not answer and not args.Math500Options.math500:
        raise LensprobeError("--metric logprob needs --answer TEXT (one, or one per --question), or --math500 N "
                             "(MATH-500 problems carry their answers).")
    if metric != "logprob" and answer:
        raise LensprobeError(f"--metric {metric} reads no answer, but --answer was given: drop it, or use "
                             "--metric logprob to measure the answer.")
    check_reference(args)
    if args.Math500Options.math500 and args.QuestionOptions.question:
        raise LensprobeError("pass --question or --math500, not both.")


def run_attribute_command(args) -> int:
    _check(args, "attribute", "attribution")
    random_heads = args.RecallCheck.count(0)
    if random_heads and not args.config.verify:
        raise LensprobeError(f"--random-heads {random_heads} draws heads to verify beside the top ones, but --verify "
                             "is 0 (nothing is verified): give --verify K too, or drop --random-heads.")
    with writing_out_dir(args.out, "attribute") as files:
        return _attribute(args, files)


def _inputs(model, args) -> tuple[list, Any, Any]:
    """The prompts, the ablation's reference and the answers the options name."""
    given = args.AnswerOptions.answer
    if args.Math500Options.math500:
        problems = load_math500(limit=args.Math500Options.math500, seed=0)
        questions = [p.problem for p in problems]
        if args.MetricSettings.metric == "logprob":  # each problem's own answer
            given = [p.answer for p in problems]
    else:
        questions = args.QuestionOptions.question or [demo_question()[0]]
    prompts = [prompt_of(model, args, q) for q in questions]
    answers = None if not given else (given[0] if len(given) == 1 else given)
    return prompts, reference_of(model, args), answers


def _attribute(args, files: list) -> int:
    model = load_cli_model(args)
    config: AttributionConfig = args.config
    heads, metric, ablation = args.HeadSelection.spec(), args.MetricSettings, args.AblationSettings.ablation
    resolve_heads(model, heads)
    prompts, reference, answers = _inputs(model, args)
    att = attribute_heads(model, prompts, metric.metric, reference=reference, answers=answers, heads=heads,
                          ablation=ablation, tokens=metric.token_pair(), batch_size=args.AblationBatch.heads_per_forward,
                          **config.attribution_kwargs())
    out = args.out
    files += [att.to_csv(out / "attribution.csv"), write_figure(attribution_heatmap(att), out / "attribution_heatmap.html")]
    summary = {"model": model_label(model), "metric": att.metric, "method": config.attribution,
               "ablation": ablation, "unit": config.unit, "filler": args.FillerOptions.filler,
               "metric_values": att.values.tolist(), "top": att.top(10).to_dict(orient="records"),
               "prompts": [prompt_json(p) for p in prompts],
               "indexing": "0-based layers and heads (L0H13 = papers' layer 1, head 14)"}
    print("top estimates: " + ", ".join(f"{r.head_label} {r.estimate:+.4g}" for r in att.top(5).itertuples()))
    if config.verify:
        ver = verify_attribution(model, prompts, metric.metric, att, top=min(config.verify, len(att.units)),
                                 sample=args.RecallCheck.count(0), batch_size=args.AblationBatch.heads_per_forward)
        files.append(out / "verification.csv")
        with atomic_file(files[-1]) as tmp:
            ver.table.to_csv(tmp, index=False)
        files.append(write_figure(attribution_scatter(ver), out / "attribution_scatter.html"))
        summary["verification"] = {"top": ver.top, "spearman": ver.spearman, "spearman_abs": ver.spearman_abs,
                                   "recall": ver.recall, "recall_kind": ver.recall_kind,
                                   "recall_interval": [ver.recall_low, ver.recall_high], "outside_top": ver.outside,
                                   "sampled": ver.sampled, "recall_note": ver.recall_text(),
                                   "misses": ver.misses.to_dict(orient="records")}
        print(ver.summary())
    files.append(atomic_write_json(out / "attribution.json", to_jsonable(summary)))
    print(f"wrote the attribution to {out.resolve()}")
    return 0


def run_find_heads_command(args) -> int:
    _check(args, "find-heads", "find_heads")
    with writing_out_dir(args.out, "find-heads") as files:
        return _find(args, files)


def _find(args, files: list) -> int:
    model = load_cli_model(args)
    config: FindHeadsConfig = args.config
    prompts, reference, answers = _inputs(model, args)
    metric, ablation = args.MetricSettings, args.AblationSettings.ablation
    kwargs = {**config.find_kwargs(), "sample": args.RecallCheck.count(10),
              "batch_size": args.AblationBatch.heads_per_forward}
    found = find_heads(model, prompts, metric.metric, reference=reference, answers=answers, ablation=ablation,
                       tokens=metric.token_pair(), **kwargs)
    out = args.out
    files.append(out / "find_heads.csv")
    with atomic_file(files[-1]) as tmp:
        found.table.to_csv(tmp, index=False)
    files.append(out / "per_prompt.csv")
    with atomic_file(files[-1]) as tmp:
        found.per_prompt_table().to_csv(tmp, index=False)
    files += [write_figure(find_heads_scatter(found), out / "find_heads_scatter.html"),
              write_figure(find_heads_heatmap(found), out / "find_heads_heatmap.html")]
    summary = {"model": model_label(model), "metric": found.metric, "ablation": ablation,
               "settings": {"metric": metric.metric, "ablation": ablation, **kwargs,
                            "tokens": metric.tokens},  # lp.find_heads' keywords
               "found": found.found.to_dict(orient="records"), "cost": found.cost, "method": found.method,
               "planned": found.planned, "capped": found.capped,
               "recall": found.recall, "recall_kind": found.recall_kind,
               "recall_interval": [found.recall_low, found.recall_high], "recall_note": found.recall_text(),
               "prompts": [prompt_json(p) for p in prompts],
               "indexing": "0-based layers and heads (L0H13 = papers' layer 1, head 14)"}
    files.append(atomic_write_json(out / "find_heads.json", to_jsonable(summary)))
    print(found.summary())
    print(f"wrote the search to {out.resolve()}")
    return 0
