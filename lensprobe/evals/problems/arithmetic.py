"""A built-in arithmetic problem set, generated from a seed: one- and two-step integer problems.

MATH-500 is far beyond a small model such as the embedded SmolLM2-135M-Instruct, so an
evaluation on it shows 0% in every condition and no difference between conditions.
:func:`arithmetic_problems` gives problems such a model solves part of the time (``"What is
17 + 25?"``, ``"What is 6 * 7 - 5?"``), with exact integer answers, so that a comparison of
conditions has something to measure. Grade them with ``extract="last-number"``: small models
rarely write ``\\boxed{}``.

Every problem is a :class:`~lensprobe.evals.problems.load.Problem` with an id
(``"arithmetic-<seed>-<index>"``), a ``level`` (1: one operation, 2: two operations) and a
``subject`` naming its operations (see :data:`ARITHMETIC_SUBJECTS`). The set depends only on
``n`` and ``seed``: it is drawn with ``random.Random(seed)`` (whose integer draws are the same
on every platform and Python version), never with ``hash()``, and a longer set starts with
the problems of a shorter one.

Example:
    >>> import lensprobe as lp
    >>> probs = lp.evals.arithmetic_problems(n=4, seed=0)
    >>> [(p.level, p.subject) for p in probs]
    [(1, 'addition'), (2, 'multiplication, addition'), (1, 'subtraction'), (2, 'multiplication, subtraction')]
"""

import random
from collections.abc import Callable
from dataclasses import dataclass

from lensprobe.core.errors import LensprobeError
from lensprobe.evals.problems.load import Problem

__all__ = ["ARITHMETIC_SUBJECTS", "MAX_PROBLEMS", "QUESTION", "arithmetic_problems"]

MAX_PROBLEMS = 400
"""At most this many problems per set (all distinct)."""


@dataclass(frozen=True)
class _Template:
    """One kind of problem: its level, subject and how to draw ``(expression, answer)``."""

    level: int
    subject: str
    draw: Callable[[random.Random], tuple[str, int]]


def _addition(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 49), rng.randint(2, 29)
    return f"{a} + {b}", a + b


def _subtraction(rng: random.Random) -> tuple[str, int]:
    b = rng.randint(2, 29)
    a = rng.randint(b + 1, 59)
    return f"{a} - {b}", a - b


def _multiplication(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return f"{a} * {b}", a * b


def _division(rng: random.Random) -> tuple[str, int]:
    b, q = rng.randint(2, 9), rng.randint(2, 9)
    return f"{b * q} / {b}", q


def _mul_add(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 19)
    return f"{a} * {b} + {c}", a * b + c


def _mul_sub(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    c = rng.randint(1, min(19, a * b - 1))
    return f"{a} * {b} - {c}", a * b - c


def _add_add(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(10, 39), rng.randint(2, 19), rng.randint(2, 19)
    return f"{a} + {b} + {c}", a + b + c


def _add_sub(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 39), rng.randint(2, 19)
    c = rng.randint(1, min(29, a + b - 1))
    return f"{a} + {b} - {c}", a + b - c


# Problem i takes template i % 8: levels alternate, every subject comes round every 8 problems.
_TEMPLATES = (
    _Template(1, "addition", _addition),
    _Template(2, "multiplication, addition", _mul_add),
    _Template(1, "subtraction", _subtraction),
    _Template(2, "multiplication, subtraction", _mul_sub),
    _Template(1, "multiplication", _multiplication),
    _Template(2, "addition, addition", _add_add),
    _Template(1, "division", _division),
    _Template(2, "addition, subtraction", _add_sub),
)

ARITHMETIC_SUBJECTS = tuple(t.subject for t in _TEMPLATES)
"""The subjects of :func:`arithmetic_problems`, in the order the problems cycle through them:
level 1 ``addition``, ``subtraction``, ``multiplication``, ``division`` and level 2
``multiplication, addition`` (``a * b + c``), ``multiplication, subtraction``,
``addition, addition``, ``addition, subtraction``."""

QUESTION = "What is {expression}?"
"""How a problem is asked; ``*`` is multiplication and ``/`` exact integer division."""

_MAX_DRAWS = 1000  # redraws of one problem whose question is already in the set


def _check_count(value, name: str, low: int, high: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        upper = f" and at most {high}" if high is not None else ""
        raise LensprobeError(f"{name} must be an integer of at least {low}{upper}, got {value!r}.")
    return value


def arithmetic_problems(n: int = 300, seed: int = 0, *, levels: int | list[int] | None = None) -> list[Problem]:
    """``n`` distinct arithmetic problems with exact integer answers, drawn from ``seed``.

    Problem ``i`` is of the kind ``i % 8`` (:data:`ARITHMETIC_SUBJECTS`): level-1 problems (one
    operation: ``a + b``, ``a - b``, ``a * b``, ``a / b`` with an integer quotient) and level-2
    problems (two operations: ``a * b + c``, ``a * b - c``, ``a + b + c``, ``a + b - c``)
    alternate, operands are small (one or two digits) and every answer is a non-negative
    integer. A question drawn twice is drawn again, so every question is distinct.

    Args:
        n: how many problems (1 to :data:`MAX_PROBLEMS`).
        seed: the seed of ``random.Random``; the same ``n`` and ``seed`` give the same problems
            everywhere, and the first ``k`` problems of a set do not depend on ``n``.
        levels: keep only these levels (``1``, ``2`` or both; default both): the first ``n``
            problems of those levels.

    Returns:
        The problems, with ids ``"arithmetic-<seed>-<index>"`` (index: position in the full
        set of both levels, four digits), answers as decimal strings, ``level`` and ``subject``.

    Raises:
        LensprobeError: ``n`` or ``seed`` is not an integer, ``n`` is out of range, or
            ``levels`` names a level other than 1 and 2.

    Example:
        >>> probs = arithmetic_problems(n=2, seed=0)
        >>> probs[0].problem.startswith("What is "), probs[0].answer.isdigit(), probs[1].level
        (True, True, 2)
    """
    _check_count(n, "n", 1, MAX_PROBLEMS)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise LensprobeError(f"seed must be an integer, got {seed!r}.")
    wanted = _levels(levels)
    rng = random.Random(seed)
    seen: set[str] = set()
    problems: list[Problem] = []
    index = 0
    while len(problems) < n:
        template = _TEMPLATES[index % len(_TEMPLATES)]
        question, answer = _draw_new(template, rng, seen)
        seen.add(question)
        if template.level in wanted:
            problems.append(Problem(id=f"arithmetic-{seed}-{index:04d}", problem=question, answer=str(answer),
                                    subject=template.subject, level=template.level))
        index += 1
    return problems


def _levels(levels) -> tuple[int, ...]:
    if levels is None:
        return (1, 2)
    chosen = [levels] if isinstance(levels, int) and not isinstance(levels, bool) else levels
    try:
        chosen = list(chosen)
    except TypeError:
        raise LensprobeError(f"levels must be 1, 2 or a list of them, got {levels!r}.") from None
    bad = [lv for lv in chosen if lv not in (1, 2) or isinstance(lv, bool)]
    if bad or not chosen:
        raise LensprobeError(f"levels must be 1 (one operation), 2 (two operations) or both, got {levels!r}.")
    return tuple(chosen)


def _draw_new(template: _Template, rng: random.Random, seen: set[str]) -> tuple[str, int]:
    for _ in range(_MAX_DRAWS):
        expression, answer = template.draw(rng)
        question = QUESTION.format(expression=expression)
        if question not in seen:
            return question, answer
    raise LensprobeError(f"ran out of distinct {template.subject!r} problems: ask for fewer problems (n).")
