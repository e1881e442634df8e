"""Tables, figures and report sections from evaluation rows; the demo's evaluation section.

:func:`summary_tables` turns result rows into accuracy tables (every grader, per level and
subject) and paired comparisons; :func:`results_section` into a report section;
:func:`write_eval_report` rebuilds everything from saved result folders (the
``lensprobe eval-report`` command).
"""

import html
import os
from pathlib import Path

from lensprobe.errors import LensprobeError
from lensprobe.evals.grading import GRADERS
from lensprobe.evals.stats import accuracy, compare

SMALL_MODEL_NOTE = (
    "A 135M-parameter model such as SmolLM2-135M-Instruct solves very few MATH problems, even at "
    "level 1: expect accuracies of a few percent with wide, overlapping intervals. This section shows "
    "the harness working end to end; it does not reproduce the paper's gains, which were measured on "
    "1.5B-7B math models over all 500 problems with long generations."
)


def _conditions_in_order(rows) -> list[str]:
    return list(dict.fromkeys(rows["condition"]))


def summary_tables(rows, *, grader: str = "math-verify", baseline: str | None = None) -> dict:
    """Accuracy tables and paired comparisons from result rows.

    Args:
        rows: result rows (from :func:`~lensprobe.evals.harness.evaluate` or
            :func:`~lensprobe.evals.results.load_results`), possibly of several models.
        grader: grader of the per-level/per-subject tables and the figures.
        baseline: condition every other condition is compared with (default: the first).

    Returns:
        ``{"accuracy": every grader per model x condition, "by_level": ..., "by_subject": ...,
        "comparisons": McNemar tests vs the baseline per model and grader}`` (DataFrames).
    """
    import pandas as pd

    if len(rows) == 0:
        raise LensprobeError("no result rows to summarise: run an evaluation first.")
    group = ["model", "condition"]
    tables = {"accuracy": pd.concat([accuracy(rows, group, grader=g) for g in GRADERS], ignore_index=True)}
    if rows["level"].notna().any():
        tables["by_level"] = accuracy(rows[rows["level"].notna()], group + ["level"], grader=grader)
    if rows["subject"].notna().any():
        tables["by_subject"] = accuracy(rows[rows["subject"].notna()], group + ["subject"], grader=grader)
    records = []
    for model, part in rows.groupby("model", sort=False):
        conds = _conditions_in_order(part)
        base = baseline if baseline is not None else conds[0]
        if base not in conds:
            raise LensprobeError(f"baseline condition {base!r} is not in the results ({conds}).")
        for other in conds:
            if other == base:
                continue
            for g in GRADERS:
                records.append({"model": model, **compare(part, base, other, grader=g).to_dict()})
    tables["comparisons"] = pd.DataFrame.from_records(records)
    return tables


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _summary_html(tables: dict, grader: str) -> str:
    acc = tables["accuracy"]
    acc = acc[acc["grader"] == grader]
    lines = ["<table class='data'><tr><th>model</th><th>condition</th><th>n</th><th>accuracy</th>"
             "<th>95% interval</th></tr>"]
    for r in acc.itertuples():
        lines.append(f"<tr><td>{html.escape(str(r.model))}</td><td>{html.escape(str(r.condition))}</td>"
                     f"<td>{r.n}</td><td>{_pct(r.accuracy)} ({r.correct})</td>"
                     f"<td>{_pct(r.low)} - {_pct(r.high)}</td></tr>")
    lines.append("</table>")
    cmp = tables["comparisons"]
    if len(cmp):
        cmp = cmp[cmp["grader"] == grader]
        lines.append("<p>Paired comparisons on the same problems (exact McNemar test):</p><ul>")
        for r in cmp.itertuples():
            lines.append(
                f"<li>{html.escape(str(r.model))}: {html.escape(r.b)} vs {html.escape(r.a)}: "
                f"{100 * r.difference:+.1f} points ({r.only_b} problems right only with {html.escape(r.b)}, "
                f"{r.only_a} only with {html.escape(r.a)}, n = {r.n}), p = {r.p_value:.3g}</li>")
        lines.append("</ul>")
    return "\n".join(lines)


def results_section(rows, *, title: str = "MATH-500 accuracy per condition", intro: str = "",
                    grader: str = "math-verify", baseline: str | None = None):
    """A report :class:`~lensprobe.report.Section` with the bars, the per-level figure and the tables."""
    from lensprobe.report import Section
    from lensprobe.viz.evals import accuracy_bars, accuracy_by_level

    tables = summary_tables(rows, grader=grader, baseline=baseline)
    acc = tables["accuracy"]
    figures = [accuracy_bars(acc[acc["grader"] == grader], title=title)]
    if "by_level" in tables and tables["by_level"]["level"].nunique() > 1:
        figures.append(accuracy_by_level(tables["by_level"]))
    graders_note = (
        f"<p>Graded with <b>{html.escape(grader)}</b> (figures). Every grader is in the tables: "
        "<i>math-verify</i> (symbolic equivalence), <i>paper</i> (the MATH dataset's string "
        "normalisation and exact match) and <i>paper-lenient</i> (also accepts a prediction that is a "
        "substring of the answer, the meaningless-tokens paper's rule; it inflates accuracy). "
        "Answers are the last <code>\\boxed{...}</code> of the generated text; a generation without one "
        "is wrong. Intervals are 95% Wilson score intervals.</p>"
    )
    models = list(dict.fromkeys(rows["model"]))
    data = {
        "models": models, "conditions": _conditions_in_order(rows), "rows": int(len(rows)),
        "problems": int(rows["problem_id"].nunique()), "grader": grader,
        "accuracy": acc.to_dict(orient="records"),
        "comparisons": tables["comparisons"].to_dict(orient="records"),
        "finish_reasons": rows["finish"].value_counts().to_dict() if "finish" in rows else {},
    }
    return Section(title=title, intro=intro + graders_note + _summary_html(tables, grader),
                   figures=figures, tables=tables, data=data)


def _load_many(folders):
    import pandas as pd

    from lensprobe.evals.results import load_results

    frames = []
    for folder in folders:
        folder = Path(folder)
        df = load_results(folder)
        if len(df) == 0:
            raise LensprobeError(f"{folder} holds no result rows yet.")
        frames.append(df.assign(_folder=folder.name))
    rows = pd.concat(frames, ignore_index=True)
    # Two folders of the same model (e.g. two settings): tell them apart by folder name.
    for model, part in rows.groupby("model"):
        if part["_folder"].nunique() > 1:
            mask = rows["model"] == model
            rows.loc[mask, "model"] = rows.loc[mask, "model"] + " (" + rows.loc[mask, "_folder"] + ")"
    return rows.drop(columns="_folder")


def write_eval_report(folders, out: str | os.PathLike | None = None, *, grader: str = "math-verify",
                      baseline: str | None = None) -> Path:
    """Rebuild tables and figures from saved result folders and write a report.

    Args:
        folders: one result folder or several (e.g. one per model: the bars then compare
            models x conditions).
        out: report folder (default: ``<first folder>/report``).
        grader: grader of the figures.
        baseline: condition the others are compared with (default: the first).

    Returns:
        The path of the report's ``index.html``; the tables are CSV files beside it.

    Example:
        >>> write_eval_report(["runs/smol", "runs/qwen"], "runs/report")
    """
    from lensprobe.report import write_report

    if isinstance(folders, (str, os.PathLike)):
        folders = [folders]
    folders = [Path(f) for f in folders]
    if not folders:
        raise LensprobeError("pass at least one result folder.")
    rows = _load_many(folders)
    section = results_section(rows, grader=grader, baseline=baseline)
    out = Path(out) if out is not None else folders[0] / "report"
    meta = {"result folders": ", ".join(str(f) for f in folders)}
    return write_report(out, [section], title="lensprobe evaluation report", meta=meta)


def build_demo_section(model, *, quick: bool = False):
    """The demo's evaluation section: level-1 MATH-500 problems under w/o, w/ Mless, w/ Mful.

    Full: 20 level-1 problems x 3 conditions, 128 new tokens, greedy: a few minutes on two
    CPU cores with SmolLM2-135M (SmolLM2-135M rarely writes a boxed answer at any length).
    Quick: 2 problems x 3 conditions, 8 tokens.
    """
    from lensprobe.evals.conditions import resolve_conditions
    from lensprobe.evals.data import load_math500, local_math500_path
    from lensprobe.evals.harness import evaluate
    from lensprobe.filler_study import model_label
    from lensprobe.report import Section

    title = "MATH-500 evaluation: w/o vs w/ Mless vs w/ Mful"
    path = local_math500_path()
    if path is None:
        return Section(title=title, intro=(
            "<p>MATH-500 was not found locally (set <code>LENSPROBE_MATH500</code> to the JSONL file, "
            "or run <code>lensprobe eval --data PATH.jsonl</code>), so this section was skipped.</p>"))
    n, tokens = (2, 8) if quick else (DEMO_PROBLEMS, DEMO_MAX_NEW_TOKENS)
    conds = resolve_conditions("w/o,w/ Mless,w/ Mful")
    builders = [c.prompt_builder(model) for c in conds]
    n_ctx = int(model.cfg.n_ctx)
    # the first level-1 problems whose prompts fit the model's context with the new tokens
    def fits(problem) -> bool:
        try:
            return max(len(b(problem.problem)) for b in builders) + tokens <= n_ctx
        except LensprobeError:  # longer than the context already
            return False

    problems = [p for p in load_math500(path, levels=1) if fits(p)][:n]
    if not problems:
        return Section(title=title, intro="<p>No level-1 problem fits this model's context; section skipped.</p>")
    rows = evaluate(model, problems, conds, max_new_tokens=tokens, batch_size=DEMO_BATCH,
                    model_name=model_label(model), progress=False)
    n_boxed = int(rows["prediction"].notna().sum())
    intro = (
        f"<p>{len(problems)} level-1 MATH-500 problems (the first in file order that fit the context) x 3 conditions on "
        f"<b>{html.escape(model_label(model))}</b>, greedy decoding, at most {tokens} new tokens, with the "
        "paper's system prompt (\"Please reason step by step, and put your final answer within "
        "\\boxed{}.\") and the filler between the system prompt and the question (Mless = \"/\" x 55, "
        "Mful = \"he\" x 55). The demo is kept small to run in a few minutes on two CPU cores; "
        "run <code>lensprobe eval</code> for the full set.</p>"
        f"<p class='note'><b>Read this first:</b> {SMALL_MODEL_NOTE} Here {n_boxed} of {len(rows)} "
        "generations contain a <code>\\boxed{...}</code> answer at all; an unboxed answer counts as "
        "wrong.</p>"
    )
    section = results_section(rows, title=title, intro=intro)
    sample = rows[["condition", "problem_id", "answer", "prediction", "math-verify", "finish", "generation"]]
    section.tables["answers"] = sample
    return section


DEMO_PROBLEMS = 20
DEMO_MAX_NEW_TOKENS = 128
DEMO_BATCH = 10
