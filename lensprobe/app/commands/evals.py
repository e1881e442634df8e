"""``lensprobe eval`` and ``lensprobe eval-report``: registered in :mod:`lensprobe.app.cli`.

Examples:
    lensprobe eval --data test.jsonl --conditions "w/o,w/ Mless,w/ Mful" --limit 20 --max-new-tokens 512 --out runs/smol
    accelerate launch --multi_gpu --num_processes 2 -m lensprobe eval --data test.jsonl --out runs/smol
    torchrun --nproc-per-node 2 -m lensprobe eval --data test.jsonl --out runs/smol
    lensprobe eval --prompt-format paper --conditions "w/o,w/ Mless,ARM" --arm-c 0.1 --arm-percentile 95 --out runs/paper
    lensprobe eval --problems arithmetic --limit 40 --extract last-number --max-new-tokens 48 --out runs/arith
    lensprobe eval-report runs/smol
"""

from dataclasses import replace

from lensprobe.app.common import (
    TEST_MODEL,
    add_inputs,
    check_out_dir,
    load_cli_model,
    out_of,
    writing_out_dir,
)
from lensprobe.app.examples import describe
from lensprobe.app.option_groups import (
    ConditionOptions,
    EvalRunOptions,
    GraderOptions,
    LimitOptions,
    ModelOptions,
    OutputOptions,
    ProblemOptions,
    ReportOptions,
    SystemOptions,
)
from lensprobe.app.parsing import add_config
from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.heads import parse_heads
from lensprobe.core.models.loading import model_label
from lensprobe.core.prompts.conditions import paper_conditions, resolve_conditions
from lensprobe.core.storage.shards import bind_local_gpu
from lensprobe.evals.problems.arithmetic import arithmetic_problems
from lensprobe.evals.problems.benchmarks import resolve_benchmark
from lensprobe.evals.problems.load import load_math500
from lensprobe.evals.results.folder import load_results
from lensprobe.evals.results.stats import pass_at_k_table, summary_tables
from lensprobe.evals.results.verdicts import resolve_grader
from lensprobe.evals.running.harness import evaluate, shard_info
from lensprobe.evals.running.protocols import arm_layer_defaults, get_protocol
from lensprobe.evals.running.settings import EvalSettings
from lensprobe.interventions.ablation import ablate_heads
from lensprobe.interventions.arm import ARM
from lensprobe.interventions.arm_settings import ArmSettings
from lensprobe.viz.eval_report import write_eval_report


def add_eval(subparsers) -> None:
    """Register ``lensprobe eval``."""
    p = subparsers.add_parser("eval", **describe(
        "eval", help="MATH-500 accuracy under prompt/intervention conditions (resumable, shardable)",
        description="Generate and grade answers for every condition x problem. One JSONL row per "
                    "(condition, problem, sample) is written to --out as soon as it is graded; rerunning "
                    "the same command resumes. Under `accelerate launch` each process takes its share of "
                    "the problems. At the end the accuracy table, paired McNemar tests and figures are "
                    "written to --out/report. A generation setting not given comes from --protocol, else the "
                    "paper format and the model's generation config (--prompt-format paper), else lp.EvalConfig."))
    add_inputs(p, ModelOptions, ProblemOptions, LimitOptions, ConditionOptions, SystemOptions, EvalRunOptions, GraderOptions,
               OutputOptions)
    add_config(p, EvalSettings, "settings")
    add_config(p, ArmSettings, "arm")
    p.set_defaults(func=run_eval, interrupted="every finished row is saved in --out; rerun the same command "
                                              "to resume")


def add_eval_report(subparsers) -> None:
    """Register ``lensprobe eval-report``."""
    p = subparsers.add_parser("eval-report", **describe(
        "eval-report", help="rebuild accuracy tables and figures from saved evaluation rows",
        description="Read one or more `lensprobe eval` output folders (several: one per model) and write "
                    "the accuracy tables (CSV), paired comparisons and figures as an HTML report "
                    "(default --out: DIR/report)."))
    add_inputs(p, ReportOptions, GraderOptions, OutputOptions)
    p.set_defaults(func=run_eval_report)


def _builtins(args):
    """The built-in conditions in ``--prompt-format`` (a ``--protocol``: the paper format with its prompt)."""
    settings = args.settings
    if settings.protocol is not None:
        return paper_conditions(prompt_format="paper", system=get_protocol(settings.protocol).system)
    return paper_conditions(prompt_format="paper") if settings.prompt_format == "paper" else None


def conditions_from_args(args, model=None, benchmark: str | None = None) -> list:
    """The conditions of ``--conditions`` in ``--prompt-format`` (or ``--protocol``), with ``--arm-*``,
    ``--system`` and ``--ablate-heads`` applied (ARM conditions start from the preset of ``model``
    on ``benchmark`` from ``--arm-source``; before the model loads any ARM stands in for the preset)."""
    layer_defaults = arm_layer_defaults(args.settings.protocol)
    options: ConditionOptions = args.ConditionOptions

    def preset_arm():  # the preset from --arm-source (or the protocol's layer defaults), the --arm-* given on top
        return args.arm.arm(model, benchmark, layer_defaults=layer_defaults)

    if model is None and args.arm.settings():  # before the model loads: the settings given are checked
        args.arm.arm(args.ModelOptions.model, benchmark, layer_defaults=layer_defaults)
    arm = preset_arm if model is not None else ARM(c=0.1, percentile=90)  # before loading: a stand-in
    conds = resolve_conditions(options.conditions, builtins=_builtins(args), arm=arm)
    system: SystemOptions = args.SystemOptions
    if system.no_system or system.system is not None:
        conds = [replace(c, system=None if system.no_system else system.system or None) for c in conds]
    if options.ablate_heads:
        parse_heads(options.ablate_heads)
        ablation = ablate_heads(options.ablate_heads)
        conds = conds + [replace(c, name=f"{c.name} [ablate {options.ablate_heads}]",
                                 interventions=c.interventions + (ablation,)) for c in conds]
    return conds


def problems_from_args(args) -> list:
    """The problems of ``--problems``: MATH-500 (or ``--data``) filtered as asked, or the arithmetic set.

    Raises:
        LensprobeError: ``--problems arithmetic`` with ``--data`` or ``--subjects``, which only
            apply to problem files.
    """
    p: ProblemOptions = args.ProblemOptions
    limit = args.LimitOptions.limit
    if p.problems != "arithmetic":
        return load_math500(p.data, subjects=p.subjects, levels=p.levels, limit=limit, seed=p.shuffle_seed)
    if p.data is not None or p.subjects is not None:
        raise LensprobeError("--problems arithmetic generates its problems: drop --data and --subjects "
                             "(--limit, --levels and --shuffle-seed choose the set).")
    return arithmetic_problems(n=limit if limit is not None else 300,
                               seed=p.shuffle_seed if p.shuffle_seed is not None else 0, levels=p.levels)


def run_eval(args) -> int:
    args.out = check_out_dir(out_of(args, "eval"), "eval")  # before the data and the model load
    with writing_out_dir(args.out, "eval", rank=shard_info()[0], pages=False):  # rows and report: kept by the store
        return _eval(args)


def _eval(args) -> int:
    problems = problems_from_args(args)
    benchmark = resolve_benchmark(args.ConditionOptions.benchmark, problems)  # picks the ARM preset
    conditions_from_args(args, None, benchmark)  # conditions, ARM settings and heads fail before the model loads
    if shard_info()[1] > 1:
        bind_local_gpu()  # one GPU per process under torchrun / accelerate launch
    model = load_cli_model(args)
    config = args.settings.resolve(model)  # the settings given; the others from the protocol, format and model
    conds = conditions_from_args(args, model, benchmark)
    name = TEST_MODEL if args.ModelOptions.model == TEST_MODEL else model_label(model)
    grader = args.GraderOptions.grader
    rows = evaluate(model, problems, conds, out=args.out, config=config, model_name=name,
                    resume=not args.EvalRunOptions.no_resume, progress=not args.OutputOptions.no_progress)
    rank, world = shard_info()
    if rank != 0:
        return 0
    index = write_eval_report([args.out], args.out / "report", grader=grader)
    print(_summary_text(rows, grader))
    print(f"rows: {args.out.resolve()}/results-rank*.jsonl; report: {index.resolve()}")
    return 0


def _summary_text(rows, grader: str | None) -> str:
    grader = resolve_grader(rows, grader)
    tables = summary_tables(rows, grader=grader)
    acc = tables["accuracy"]
    beside = {r.condition: r for r in acc[acc["grader"] == "math-verify"].itertuples()} if grader != "math-verify" \
        else {}
    lines = [f"accuracy ({grader} grader, 95% Wilson interval{'; math-verify beside' if beside else ''}):"]
    for r in acc[acc["grader"] == grader].itertuples():
        mv = beside.get(r.condition)
        lines.append(f"  {r.condition:<24} {100 * r.accuracy:5.1f}%  [{100 * r.low:5.1f}, {100 * r.high:5.1f}]"
                     f"  ({r.correct}/{r.n})" + (f"   math-verify {100 * mv.accuracy:5.1f}%" if mv else ""))
    lines += _samples_lines(rows, grader)
    cmp = tables["comparisons"]
    for r in cmp[cmp["grader"] == grader].itertuples() if len(cmp) else []:
        lines.append(f"  {r.b} vs {r.a}: {100 * r.difference:+.1f} points, McNemar exact p = {r.p_value:.3g} "
                     f"(n = {r.n})")
    errors = rows[rows["finish"] == "error"] if "finish" in rows.columns else rows.iloc[:0]
    if len(errors):
        first = errors.iloc[0]
        lines.append(f"{len(errors)} row(s) could not run and are left out of the accuracy (finish 'error'), e.g. "
                     f"{first['condition']} / problem {first['problem_id']!r}: {first['error']}; rerun the same "
                     "command to retry them")
    graded = rows[~rows["finish"].isin(["error", "nonfinite"])] if "finish" in rows.columns else rows
    timed_out = int(graded["math-verify"].isna().sum()) if "math-verify" in graded.columns else 0
    if timed_out:
        lines.append(f"{timed_out} row(s) have no math-verify verdict: it timed out grading them (left out of its "
                     "accuracy; the other graders' verdicts stand)")
    return "\n".join(lines)


def _samples_lines(rows, grader: str) -> list[str]:
    """pass@k (k = 3, or the fewest samples a problem has) and avg over the samples, when problems
    have several samples."""
    graded = rows[rows[grader].notna()]
    if "sample" not in graded.columns or len(graded) == 0 or graded["sample"].max() < 1:
        return []
    k = min(3, int(graded.groupby(["condition", "problem_id"]).size().min()))
    table = pass_at_k_table(graded, k, "condition", grader=grader)
    return [f"  {r['condition']:<24} pass@{k} {100 * r[f'pass@{k}']:5.1f}%  avg {100 * r['avg']:5.1f}%  "
            f"({r['problems']} problems, {r['samples']} samples)" for r in table.to_dict("records")]


def run_eval_report(args) -> int:
    report: ReportOptions = args.ReportOptions
    given = args.OutputOptions.out
    out = given if given is not None else report.dirs[0] / "report"
    check_out_dir(out, "report")
    with writing_out_dir(out, "eval-report", pages=False):  # the report page lists its own files
        index = write_eval_report(report.dirs, given, grader=args.GraderOptions.grader, baseline=report.baseline)
    if len(report.dirs) == 1:
        print(_summary_text(load_results(report.dirs[0]), args.GraderOptions.grader))
    print(f"report written to {index.resolve()}")
    return 0
