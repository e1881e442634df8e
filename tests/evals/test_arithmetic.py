"""The built-in arithmetic problem set: deterministic from its seed, answers right (recomputed here
from the question text with Python's ``ast``), ids unique, levels and subjects as documented; and
the embedded model solves part of it with last-number grading."""

import ast
import operator
import re

import pytest

import lensprobe as lp
from lensprobe.evals.problems.arithmetic import ARITHMETIC_SUBJECTS, MAX_PROBLEMS

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_NAMES = {ast.Add: "addition", ast.Sub: "subtraction", ast.Mult: "multiplication", ast.Div: "division"}


def _expression(question: str) -> str:
    m = re.fullmatch(r"What is ([0-9 +\-*/]+)\?", question)
    assert m, question
    return m.group(1)


def _evaluate(node):
    """Evaluate an integer +, -, *, / expression tree; also return its operations, innermost first."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value, []
    assert isinstance(node, ast.BinOp) and type(node.op) in _OPS, ast.dump(node)
    left, lops = _evaluate(node.left)
    right, rops = _evaluate(node.right)
    return _OPS[type(node.op)](left, right), lops + rops + [_NAMES[type(node.op)]]


def test_answers_levels_and_subjects_match_an_independent_evaluation():
    problems = lp.evals.arithmetic_problems()
    assert len(problems) == 300
    for p in problems:
        value, ops = _evaluate(ast.parse(_expression(p.problem), mode="eval"))
        assert value == int(value) and value >= 0, p
        assert p.answer == str(int(value)), p
        assert p.level == len(ops), p
        assert p.subject == ", ".join(ops), p


def test_ids_are_unique_and_questions_distinct():
    problems = lp.evals.arithmetic_problems(n=MAX_PROBLEMS, seed=3)
    assert len({p.id for p in problems}) == len({p.problem for p in problems}) == MAX_PROBLEMS
    assert all(p.id.startswith("arithmetic-3-") for p in problems)


def test_same_seed_same_problems_and_prefixes_stable():
    a = lp.evals.arithmetic_problems(n=50, seed=7)
    assert a == lp.evals.arithmetic_problems(n=50, seed=7)
    assert lp.evals.arithmetic_problems(n=20, seed=7) == a[:20]
    other = lp.evals.arithmetic_problems(n=50, seed=8)
    assert [p.problem for p in other] != [p.problem for p in a]


def test_levels_alternate_and_counts_balance():
    problems = lp.evals.arithmetic_problems(n=80, seed=0)
    assert [p.level for p in problems] == [1, 2] * 40
    assert {s: sum(p.subject == s for p in problems) for s in ARITHMETIC_SUBJECTS} == dict.fromkeys(
        ARITHMETIC_SUBJECTS, 10)
    ones = lp.evals.arithmetic_problems(n=30, seed=0, levels=1)
    assert len(ones) == 30 and {p.level for p in ones} == {1}
    # the level filter keeps the full set's problems and ids
    full = {p.id: p for p in lp.evals.arithmetic_problems(n=60, seed=0)}
    assert all(full[p.id] == p for p in ones)


@pytest.mark.unchecked
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"n": 0}, r"n must be an integer of at least 1 and at most 400, got 0"),
    ({"n": MAX_PROBLEMS + 1}, r"n must be an integer of at least 1 and at most 400"),
    ({"n": 2.5}, r"n must be an integer"),
    ({"seed": "0"}, r"seed must be an integer, got '0'"),
    ({"levels": 3}, r"levels must be 1 \(one operation\), 2 \(two operations\) or both, got 3"),
])
def test_bad_arguments_say_what_to_fix(kwargs, match):
    with pytest.raises(lp.LensprobeError, match=match):
        lp.evals.arithmetic_problems(**kwargs)


def test_the_embedded_model_solves_some_of_the_set(smol):
    problems = lp.evals.arithmetic_problems(n=24, seed=0)
    rows = lp.evaluate(smol, problems, "w/o", max_new_tokens=48, extract="last-number", batch_size=12,
                       progress=False, rank=0, world_size=1)
    # regrade here: the last integer of the generation against the ast value of the question
    right = 0
    for _, r in rows.iterrows():
        value, _ = _evaluate(ast.parse(_expression(next(p.problem for p in problems if p.id == r["problem_id"])),
                                       mode="eval"))
        numbers = re.findall(r"\d+(?:\.\d+)?", r["generation"].replace(",", ""))
        right += bool(numbers) and float(numbers[-1]) == value
    assert 0 < right < len(problems)
    assert 0 < int(rows["math-verify"].sum()) < len(problems)
