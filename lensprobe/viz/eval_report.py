"""The evaluation report: accuracy bars, accuracy per level and the tables, from result rows or folders.

:func:`results_section` turns result rows into a report :class:`~lensprobe.viz.report.Section`
(tables from :func:`lensprobe.evals.results.stats.summary_tables`); :func:`write_eval_report`
rebuilds everything from saved result folders (the ``lensprobe eval-report`` command).
"""

import html
import os
from pathlib import Path

from lensprobe.core.errors import LensprobeError
from lensprobe.evals.results.folder import load_many_results
from lensprobe.evals.results.runfacts import RunFacts, run_facts
from lensprobe.evals.results.stats import conditions_in_order, summary_tables
from lensprobe.evals.results.verdicts import verdict_columns
from lensprobe.viz.evals import accuracy_bars, accuracy_by_level
from lensprobe.viz.report import Section, write_report

__all__ = ["results_section", "write_eval_report"]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _beside(tables: dict, grader: str) -> dict:
    """``(model, condition) -> math-verify accuracy row`` when ``grader`` is another column."""
    acc = tables["accuracy"]
    if grader == "math-verify":
        return {}
    other = acc[acc["grader"] == "math-verify"]
    return {(r.model, r.condition): r for r in other.itertuples()}


def _summary_html(tables: dict, grader: str) -> str:
    acc = tables["accuracy"]
    acc = acc[acc["grader"] == grader]
    beside = _beside(tables, grader)
    extra = "<th>math-verify</th>" if beside else ""
    lines = [f"<table class='data'><tr><th>model</th><th>condition</th><th>n</th><th>accuracy ({html.escape(grader)})"
             f"</th><th>95% interval</th>{extra}</tr>"]
    for r in acc.itertuples():
        mv = beside.get((r.model, r.condition))
        cell = f"<td>{_pct(mv.accuracy)} ({mv.correct}/{mv.n})</td>" if mv is not None else ("<td></td>" if beside
                                                                                             else "")
        lines.append(f"<tr><td>{html.escape(str(r.model))}</td><td>{html.escape(str(r.condition))}</td>"
                     f"<td>{r.n}</td><td>{_pct(r.accuracy)} ({r.correct})</td>"
                     f"<td>{_pct(r.low)} - {_pct(r.high)}</td>{cell}</tr>")
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


_GRADERS = {
    "math-verify": "<i>math-verify</i> (symbolic equivalence)",
    "paper": "<i>paper</i> (the MATH dataset's string normalisation and exact match)",
    "paper-lenient": "<i>paper-lenient</i> (also accepts a prediction that is a substring of the answer)",
    "paper-exact": "<i>paper-exact</i> (the meaningless-tokens authors' own <code>is_equiv</code> on prompt + "
                   "generation, the metric of their tables; it reads boxed answers whatever the extraction, and "
                   "its substring rule inflates accuracy)",
}


def _graders_note(rows, facts: RunFacts) -> str:
    """Which grader the figures count, what every grader in the tables is, and how answers were read."""
    described = [_GRADERS.get(c, f"<i>{html.escape(c)}</i> (a column of your own)") for c in verdict_columns(rows)]
    return (f"<p>Graded with <b>{html.escape(facts.grader)}</b> (figures). Every grader is in the tables: "
            f"{', '.join(described)}. {facts.extraction_note} Intervals are 95% Wilson score intervals.</p>")


def results_section(rows, *, title: str | None = None, intro: str = "",
                    grader: str | None = None, baseline: str | None = None):
    """A report :class:`~lensprobe.viz.report.Section` with the bars, the per-level figure and the tables.

    Titles, axes and notes say what ran (:func:`~lensprobe.evals.results.runfacts.run_facts`: the problem set,
    the answer extraction, the grader). ``title`` replaces the section's title (default: the problem
    set's accuracy per condition). ``grader`` is the verdict column of the figures and the summary
    (``None``: the rows' default, ``paper-exact`` for a folder in the authors' format, with
    ``math-verify`` beside it).

    Example:
        >>> section = results_section(lp.evals.load_results("runs/paper"))   # paper-exact + math-verify
    """
    facts = run_facts(rows, grader)
    grader, title = facts.grader, title or facts.title
    tables = summary_tables(rows, grader=grader, baseline=baseline)
    acc = tables["accuracy"]
    figures = [accuracy_bars(acc[acc["grader"] == grader], title=title)]
    if "by_level" in tables and tables["by_level"]["level"].nunique() > 1:
        figures.append(accuracy_by_level(tables["by_level"], title=f"{facts.problems}: accuracy per level "
                                         "(bars: 95% Wilson interval)",
                                         level_title=facts.level_title))
    data = {
        "problem_set": facts.problems, "extract": list(facts.extract),
        "models": list(facts.models), "conditions": conditions_in_order(rows), "rows": int(len(rows)),
        "problems": facts.n_problems, "grader": grader,
        "accuracy": acc.to_dict(orient="records"),
        "comparisons": tables["comparisons"].to_dict(orient="records"),
        "finish_reasons": rows["finish"].value_counts().to_dict() if "finish" in rows else {},
    }
    return Section(title=title, intro=intro + _graders_note(rows, facts) + _summary_html(tables, grader),
                   figures=figures, tables=tables, data=data)


def write_eval_report(folders, out: str | os.PathLike | None = None, *, grader: str | None = None,
                      baseline: str | None = None) -> Path:
    """Rebuild tables and figures from saved result folders and write a report.

    Args:
        folders: one result folder or several (e.g. one per model: the bars then compare
            models x conditions).
        out: report folder (default: ``<first folder>/report``).
        grader: verdict column of the figures (``None``: ``paper-exact`` when every folder was
            evaluated in the authors' format, else ``math-verify``).
        baseline: condition the others are compared with (default: the first).

    Returns:
        The path of the report's ``index.html``; the tables are CSV files beside it.

    Example:
        >>> write_eval_report(["runs/smol", "runs/qwen"], "runs/report")
    """

    if isinstance(folders, (str, os.PathLike)):
        folders = [folders]
    folders = [Path(f) for f in folders]
    if not folders:
        raise LensprobeError("pass at least one result folder.")
    rows = load_many_results(folders)
    section = results_section(rows, grader=grader, baseline=baseline)
    out = Path(out) if out is not None else folders[0] / "report"
    meta = {"result folders": ", ".join(str(f) for f in folders), **run_facts(rows, grader).facts()}
    return write_report(out, [section], title="lensprobe evaluation report", meta=meta)
