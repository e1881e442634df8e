"""What an evaluation ran, read from its result table: the problem set, how answers were read, the
grader, the models and the conditions. Reports write their titles, axes and notes from it, never from
a default.

A result table carries its answer extraction in ``DataFrame.attrs["extract"]`` (:func:`mark_extract`:
set by :func:`~lensprobe.evals.running.harness.evaluate` and :func:`~lensprobe.evals.results.folder.load_results` from
the run's settings); the problem set is recognised from the problem ids (lensprobe's MATH-500 copy, its
arithmetic set, AIME 2025), else it is named by what the table holds.

Example:
    >>> facts = run_facts(lp.evals.load_results("runs/arith"))
    >>> facts.title
    'Arithmetic problems: accuracy per condition'
"""

from dataclasses import dataclass

from lensprobe.evals.problems.benchmarks import benchmark_of_ids
from lensprobe.evals.results.verdicts import resolve_grader

__all__ = ["RunFacts", "extract_of", "mark_extract", "run_facts"]

_ATTR = "extract"

PROBLEM_SETS = {"math500": "MATH-500", "aime2025": "AIME 2025", "arithmetic": "Arithmetic problems"}
"""Display names of the problem sets :func:`run_facts` recognises from their ids."""

_LEVELS = {"arithmetic": "level (number of operations)", "math500": "difficulty level (MATH's 1-5)"}

_EXTRACTION = {
    "boxed": "Answers are the last <code>\\boxed{...}</code> of the generated text; a generation without one "
             "is wrong.",
    "last-number": "Answers are the last number of the generated text (thousands separators and a final "
                   "period dropped); a generation without a number is wrong.",
}


def extract_of(config: dict | None) -> str:
    """The answer extraction recorded in a result folder's ``config.json`` (``"boxed"`` when not
    recorded: the default is left out of a run's identity)."""
    generation = ((config or {}).get("settings") or {}).get("generation") or {}
    return str(generation.get("extract") or "boxed")


def mark_extract(df, *extract: str):
    """``df`` with the answer extraction(s) of its rows recorded (``df.attrs``); returns ``df``."""
    df.attrs[_ATTR] = tuple(dict.fromkeys(extract))
    return df


@dataclass(frozen=True)
class RunFacts:
    """What a result table records about its run.

    Attributes:
        problems: the problem set's display name (``"MATH-500"``, ``"Arithmetic problems"``, or
            ``"Problems"`` for a set lensprobe does not recognise).
        key: the set's key (``"math500"``, ``"arithmetic"``, ``"aime2025"``), ``None`` if unrecognised.
        extract: the answer extraction(s) of the rows (``()`` when the table does not say).
        grader: the verdict column counted.
        models: the models, in order.
        conditions: the conditions, in order.
        n_problems: distinct problems.
    """

    problems: str
    key: str | None
    extract: tuple[str, ...]
    grader: str
    models: tuple[str, ...]
    conditions: tuple[str, ...]
    n_problems: int

    @property
    def title(self) -> str:
        """``"<problem set>: accuracy per condition"``."""
        return f"{self.problems}: accuracy per condition"

    @property
    def level_title(self) -> str:
        """The axis title of the problems' ``level``."""
        return _LEVELS.get(self.key or "", "level")

    @property
    def extraction_note(self) -> str:
        """How answers were read (HTML), one sentence per extraction method."""
        if not self.extract:
            return "How answers were read is not recorded with these rows."
        return " ".join(_EXTRACTION.get(m, f"Answers were read by <code>{m}</code>.") for m in self.extract)

    def facts(self) -> dict[str, str]:
        """The facts as ``{label: text}`` for a report's header."""
        return {"problems": f"{self.problems} ({self.n_problems} problems)",
                "answers read by": ", ".join(self.extract) or "not recorded", "grader": self.grader,
                "models": ", ".join(self.models), "conditions": ", ".join(self.conditions)}


def run_facts(rows, grader: str | None = None) -> RunFacts:
    """What ``rows`` (a result table) ran: see :class:`RunFacts`.

    Args:
        rows: result rows (:func:`~lensprobe.evals.running.harness.evaluate`, :func:`~lensprobe.evals.results.folder.load_results`).
        grader: the verdict column counted (``None``: the table's default).

    Example:
        >>> run_facts(rows).problems
        'MATH-500'
    """
    ids = [str(i) for i in dict.fromkeys(rows["problem_id"])]
    key = "arithmetic" if ids and all(i.startswith("arithmetic-") for i in ids) else benchmark_of_ids(ids)
    models = tuple(str(m) for m in dict.fromkeys(rows["model"])) if "model" in rows.columns else ()
    return RunFacts(problems=PROBLEM_SETS.get(key or "", "Problems"), key=key,
                    extract=tuple(rows.attrs.get(_ATTR, ())), grader=resolve_grader(rows, grader), models=models,
                    conditions=tuple(str(c) for c in dict.fromkeys(rows["condition"])), n_problems=len(ids))
