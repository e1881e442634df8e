"""Which benchmark a problem set is: the key that picks the authors' ARM preset and the published
numbers a run is compared with.

:func:`infer_benchmark` recognises lensprobe's built-in MATH-500 copy (every problem id is one of its
``unique_id`` values) and AIME 2025 read with :func:`~lensprobe.evals.problems.load.load_problems` from a file
named ``aime2025*`` (ids ``"aime2025-0"`` ...). Other sets (AIME 2022-2024, your own files) need
``benchmark=`` (``--benchmark``).
"""

import functools
import json

from lensprobe.evals.problems.load import math500_path
from lensprobe.interventions.arm_presets import benchmark_key

__all__ = ["benchmark_of_ids", "infer_benchmark", "resolve_benchmark"]


@functools.cache
def _math500_ids() -> frozenset[str]:
    ids = set()
    with open(math500_path(), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                ids.add(str(json.loads(line).get("unique_id")))
    return frozenset(ids)


def infer_benchmark(problems) -> str | None:
    """``"math500"`` for problems of lensprobe's MATH-500 copy, ``"aime2025"`` for ids
    ``"aime2025-<n>"``, else ``None``.

    Example:
        >>> infer_benchmark(lp.load_math500(limit=3))
        'math500'
    """
    return benchmark_of_ids([p.id for p in problems])


def benchmark_of_ids(ids) -> str | None:
    """:func:`infer_benchmark` from the problem ids alone (e.g. a result table's ``problem_id``)."""
    ids = [str(i) for i in ids]
    if not ids:
        return None
    if all(i.startswith("aime2025-") for i in ids):
        return "aime2025"
    if all(i in _math500_ids() for i in ids):
        return "math500"
    return None


def resolve_benchmark(benchmark: str | None, problems) -> str | None:
    """``benchmark`` as lensprobe's key (checked), else the one inferred from ``problems`` (or ``None``).

    Raises:
        LensprobeError: an unknown benchmark name.

    Example:
        >>> resolve_benchmark("AIME24", problems)
        'aime2024'
    """
    if benchmark is not None:
        return benchmark_key(benchmark)
    return infer_benchmark(problems)
