"""``lensprobe patch-heads``: each head's output on the prompt with a filler replaced, at the positions both
prompts share, by its output on the same prompt without the filler, over one question or many
(:func:`~lensprobe.experiments.headpatch.patch_heads`)."""

from dataclasses import dataclass, field

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
    ComparedFillerOptions,
    Math500Options,
    ModelOptions,
    OutputOptions,
    QuestionOptions,
    SystemOptions,
)
from lensprobe.app.parsing import add_config
from lensprobe.app.sections.filler import demo_question
from lensprobe.core.checks import check_annotated
from lensprobe.core.errors import LensprobeError, SettingError
from lensprobe.core.hooks.heads import resolve_heads
from lensprobe.core.models.loading import model_label
from lensprobe.core.prompts.conditions import canonical_condition_name
from lensprobe.core.storage.jsonable import to_jsonable
from lensprobe.core.storage.store import atomic_file, atomic_write_json
from lensprobe.evals.problems.load import load_math500
from lensprobe.experiments.head_settings import AblationBatch, HeadSelection, MetricSettings
from lensprobe.experiments.headpatch import patch_heads
from lensprobe.studies.filler import FillerSetup
from lensprobe.viz import sweep_heatmap

__all__ = ["PatchHeadsConfig", "add_patch_heads", "run_patch_heads_command"]


@dataclass(frozen=True)
class PatchHeadsConfig:
    """Which positions ``lensprobe patch-heads`` patches.

    Example:
        >>> PatchHeadsConfig("question,system").segment_list()
        ['question', 'system']
    """

    patch_segments: str | None = field(default=None, metadata={"custom_args": {"metavar": "NAMES"}})
    """segments to patch, comma-separated (e.g. question,system); default: every segment both prompts have"""

    def __post_init__(self) -> None:
        check_annotated(self)
        if self.patch_segments is not None and not self.segment_list():
            raise SettingError("patch_segments", f"expected segment names such as question, got "
                                                 f"{self.patch_segments!r}")

    def segment_list(self) -> list[str] | None:
        """The segment names given (``None``: every segment both prompts have)."""
        if self.patch_segments is None:
            return None
        return [s.strip() for s in self.patch_segments.split(",") if s.strip()]


def add_patch_heads(subparsers) -> None:
    """Register ``lensprobe patch-heads``."""
    p = subparsers.add_parser("patch-heads", **describe(
        "patch-heads", help="which heads carry a filler's effect: each head patched from the prompt without it",
        description="Per-head activation patching (lp.patch_heads): for each question (or --math500 problem), "
                    "each head's output (hook_z) on the prompt with the --compare filler is replaced, at every "
                    "position both prompts share (paired by segment; the filler has no counterpart), by its output "
                    "on the same prompt without the filler, one head at a time. Writes patched_heads.csv (mean "
                    "patched - clean per [layer, head]), patched_heads_long.csv (per question and head: clean, "
                    "patched, change, corrupted, share), pairs.csv, patched_heads_heatmap.html, "
                    "patched_heads_share.html and patch_heads.json. The share is (patched - clean) / (corrupted - "
                    "clean), NaN when that total effect is about 0. Heads are 0-based: L0H13 is the papers' layer "
                    "1, head 14."))
    add_inputs(p, ModelOptions, QuestionOptions, AnswerOptions, Math500Options, SystemOptions, ComparedFillerOptions,
               HeadSelection, MetricSettings, AblationBatch, OutputOptions)
    add_config(p, PatchHeadsConfig, "config")
    p.set_defaults(func=run_patch_heads_command)


def _check(args) -> None:
    """Argument errors before the model loads."""
    args.out = check_out_dir(out_of(args, "patch-heads"), "patch_heads")
    questions, n = args.QuestionOptions.question, args.Math500Options.math500
    if n and questions:
        raise LensprobeError("pass --question or --math500, not both.")
    if canonical_condition_name(args.ComparedFillerOptions.compare) == "w/o":
        raise LensprobeError("--compare w/o has no filler: the two prompts would be the same; use e.g. "
                             "--compare 'w/ Mless'.")
    metric, answer = args.MetricSettings.metric, args.AnswerOptions.answer
    if metric == "logprob" and not answer and not n:
        raise LensprobeError("--metric logprob needs --answer TEXT (MATH-500 problems bring their own answers).")
    if metric != "logprob" and answer:
        raise LensprobeError(f"--metric {metric} reads no answer, but --answer was given: drop it, or use "
                             "--metric logprob to measure the answer.")
    count = n or len(questions or [None])
    if answer and len(answer) not in (1, count):
        raise LensprobeError(f"--answer was given {len(answer)} times for {count} questions: give it once, or once "
                             "per question.")


def run_patch_heads_command(args) -> int:
    _check(args)
    with writing_out_dir(args.out, "patch-heads") as files:
        return _patch(args, files)


def _patch(args, files: list) -> int:
    model = load_cli_model(args, progress=not args.OutputOptions.no_progress)
    heads = args.HeadSelection.spec()
    resolve_heads(model, heads)  # bad heads fail before any work
    if args.Math500Options.math500:
        items: list = load_math500(limit=args.Math500Options.math500, seed=0)
    else:
        items = args.QuestionOptions.question or [demo_question()[0]]
    given = args.AnswerOptions.answer
    answers = (given[0] if len(given) == 1 else given) if given else None
    condition = FillerSetup(system=system_of(args)).condition(args.ComparedFillerOptions.compare)
    metric = args.MetricSettings
    res = patch_heads(model, items, filler=condition, metric=metric.metric, heads=heads, answers=answers,
                      tokens=metric.token_pair(), segments=args.config.segment_list(),
                      batch_size=args.AblationBatch.heads_per_forward, progress=not args.OutputOptions.no_progress)
    out = args.out
    tables = {"patched_heads.csv": (res.table, True), "patched_heads_long.csv": (res.to_dataframe(), False),
              "pairs.csv": (res.pairs_table(), False)}
    for name, (table, index) in tables.items():
        files.append(out / name)
        with atomic_file(files[-1]) as tmp:
            table.to_csv(tmp, index=index)
    files += [write_figure(sweep_heatmap(res), out / "patched_heads_heatmap.html"),
              write_figure(sweep_heatmap(res.grid("share"), title=f"Share of the total effect on {res.metric} each "
                                                                  "head carries when patched"),
                           out / "patched_heads_share.html")]
    questions = [getattr(q, "problem", q) for q in items]
    files.append(atomic_write_json(out / "patch_heads.json", to_jsonable({
        "model": model_label(model), "compare": condition.name, "corrupted": "the same prompt without the filler",
        "settings": {"metric": metric.metric, "tokens": metric.tokens, "heads": heads, "answers": answers,
                     "segments": args.config.segment_list(), "batch_size": args.AblationBatch.heads_per_forward},
        **res.describe(), "questions": questions,
        "problem_ids": [getattr(q, "id", None) for q in items],
        "indexing": "0-based layers and heads (L0H13 = papers' layer 1, head 14)"})))
    print(res.summary())
    print(f"wrote {len(files)} files to {out.resolve()}")
    return 0
