"""MATH-500 evaluation across prompt and intervention conditions.

- :mod:`~lensprobe.evals.problems.load`: :func:`load_math500` (the copy lensprobe ships, a local JSONL
  file, or the hub), :func:`load_problems` (any JSONL or Parquet problem set, e.g. AIME),
  :class:`Problem`.
- :mod:`~lensprobe.evals.problems.arithmetic`: :func:`arithmetic_problems`, one- and two-step integer
  problems drawn from a seed (a set small models solve part of the time).
- :mod:`~lensprobe.core.prompts.conditions` (re-exported here): :class:`Condition` and the built-in
  conditions ``"w/o"``, ``"w/ Mless"``, ``"w/ Mful"``, ``"random sentence"``.
- :mod:`~lensprobe.evals.grading.grade`: :func:`extract_boxed`, :func:`extract_last_number`
  (``extract="last-number"``), :func:`grade` (math-verify and the MATH paper's string grader).
- :mod:`~lensprobe.evals.running.harness`: :func:`evaluate` (batched generation, resumable rows,
  sharding under ``accelerate launch``).
- :mod:`~lensprobe.evals.results.folder`: result folders, :func:`load_results`.
- :mod:`~lensprobe.evals.results.runfacts`: :func:`run_facts`, what a result table ran (problem set,
  answer extraction, grader, models, conditions), the words of its report.
- :mod:`~lensprobe.evals.results.stats`: :func:`accuracy` with Wilson intervals (``k=`` for the mean
  unbiased pass@k over problems), :func:`compare` (exact McNemar test), :func:`pass_at_k`,
  :func:`avg_at_k`; any verdict column (:data:`VERDICT_COLUMNS`, ``paper-exact`` included).
- :mod:`~lensprobe.evals.running.protocols`: the authors' protocols by name (:data:`PROTOCOLS`).
- :mod:`~lensprobe.evals.results.published`: the papers' published numbers (:func:`published_numbers`).
- :func:`~lensprobe.evals.results.stats.summary_tables`: accuracy tables and paired comparisons.

Example:
    >>> import lensprobe as lp
    >>> model = lp.load_model()
    >>> probs = lp.load_math500("test.jsonl", levels=1, limit=20)
    >>> rows = lp.evaluate(model, probs, "w/o,w/ Mless,w/ Mful", out="runs/smol", max_new_tokens=256)
    >>> lp.evals.accuracy(rows, "condition")
    >>> aime = lp.evals.load_problems("aime2025.jsonl")   # 'question'/'answer' rows
    >>> lp.evals.compare(rows, "w/o", "w/ Mless").p_value

May import: :mod:`lensprobe.core`, :mod:`lensprobe.interventions`, :mod:`lensprobe.generation`.
"""

from lensprobe.core.boundary import guard_public
from lensprobe.core.prompts.conditions import (
    BUILTIN_CONDITIONS,
    MatchedRandomSentence,
    builtin_condition,
    resolve_conditions,
)
from lensprobe.evals.grading.extract import EXTRACT_METHODS, extract_boxed, extract_last_number
from lensprobe.evals.grading.grade import GRADERS, grade, grade_all, normalize_answer
from lensprobe.evals.problems.arithmetic import arithmetic_problems
from lensprobe.evals.problems.benchmarks import infer_benchmark
from lensprobe.evals.problems.load import (
    Problem,
    load_math500,
    load_problems,
    math500_path,
    read_jsonl_problems,
)
from lensprobe.evals.results.folder import load_results, read_config
from lensprobe.evals.results.published import PublishedNumber, published_numbers, published_table
from lensprobe.evals.results.runfacts import RunFacts, run_facts
from lensprobe.evals.results.stats import (
    PairedComparison,
    accuracy,
    avg_at_k,
    compare,
    mcnemar_exact,
    pass_at_k,
    pass_at_k_table,
    wilson_interval,
)
from lensprobe.evals.results.verdicts import PAPER_EXACT, VERDICT_COLUMNS
from lensprobe.evals.running.harness import ErrorRowsWarning, EvalConfig, evaluate, shard_info
from lensprobe.evals.running.protocols import PROTOCOLS, Protocol, get_protocol

__all__ = [
    "BUILTIN_CONDITIONS",
    "EXTRACT_METHODS",
    "GRADERS",
    "PAPER_EXACT",
    "PROTOCOLS",
    "VERDICT_COLUMNS",
    "Protocol",
    "PublishedNumber",
    "RunFacts",
    "avg_at_k",
    "get_protocol",
    "infer_benchmark",
    "published_numbers",
    "published_table",
    "ErrorRowsWarning",
    "EvalConfig",
    "MatchedRandomSentence",
    "PairedComparison",
    "Problem",
    "accuracy",
    "arithmetic_problems",
    "builtin_condition",
    "compare",
    "evaluate",
    "extract_boxed",
    "extract_last_number",
    "grade",
    "grade_all",
    "load_math500",
    "load_problems",
    "load_results",
    "math500_path",
    "mcnemar_exact",
    "normalize_answer",
    "pass_at_k",
    "pass_at_k_table",
    "read_config",
    "read_jsonl_problems",
    "resolve_conditions",
    "run_facts",
    "shard_info",
    "wilson_interval",
]

guard_public(globals())  # public functions raise one LensprobeError (lensprobe.core.boundary)
