"""ARM conditions under continuous batching: per-row statistics make each row of an evaluation what it
is alone, so an ARM condition runs in one generation call with ``batch_size`` rows live (no
one-problem-at-a-time special case); a batch-dependent intervention still runs each problem alone."""

import pytest

import lensprobe as lp
from lensprobe.evals import Problem
from lensprobe.prompts import Condition

QUESTIONS = ["What is 1+1?", "Compute 12 * 3 and give the answer, showing every step of the work.",
             "Hi?", "Solve for x: 2x + 3 = 7, then check the solution by substituting it back.",
             "What is 7?"]
ARM = dict(layer=0, c=0.5, percentile=90)


def problems():
    return [Problem(id=f"q{i}", problem=q, answer=str(i)) for i, q in enumerate(QUESTIONS)]


def calls_of(monkeypatch):
    """The ``lp.generate`` calls an evaluation makes: (condition's ARM per_row flags, prompts, batch_size)."""
    from lensprobe.evals.running import execute as running

    calls, real = [], running.generate

    def spy(model, prompts, *args, interventions=(), batch_size=None, **kw):
        calls.append(([i.per_row for i in interventions if isinstance(i, lp.ARM)], len(prompts), batch_size))
        return real(model, prompts, *args, interventions=interventions, batch_size=batch_size, **kw)

    monkeypatch.setattr(running, "generate", spy)
    return calls


@pytest.mark.parametrize("sampling", [dict(), dict(do_sample=True, n_samples=2, seed=4)], ids=["greedy", "sampling"])
def test_an_arm_condition_runs_with_continuous_batching_and_equals_each_problem_alone(tiny, monkeypatch, sampling):
    run = dict(max_new_tokens=10, progress=False, arm=lp.ARM(**ARM), **sampling)
    alone = lp.evaluate(tiny, problems(), "ARM,w/o", batch_size=1, **run)
    calls = calls_of(monkeypatch)
    batched = lp.evaluate(tiny, problems(), "ARM,w/o", batch_size=3, **run)
    drop = ["seconds", "rank", "config_hash"]  # batch_size is part of the run's identity: the run hash differs
    assert set(alone["config_hash"]).isdisjoint(set(batched["config_hash"]))
    assert alone.drop(columns=drop).reset_index(drop=True).equals(batched.drop(columns=drop).reset_index(drop=True))
    arm_calls = [c for c in calls if c[0]]
    assert arm_calls == [([True], len(QUESTIONS), 3)]  # every ARM row in one call, three live at once
    plain = lp.evaluate(tiny, problems(), "w/o", batch_size=3, **{k: v for k, v in run.items() if k != "arm"})
    arm_rows = batched[batched["condition"] == "ARM"].reset_index(drop=True)
    assert list(arm_rows["generation"]) != list(plain["generation"])  # ARM changed the answers


def test_a_batch_dependent_intervention_runs_each_problem_alone(tiny, monkeypatch):
    calls = calls_of(monkeypatch)
    whole = lp.ARM(**ARM, per_row=False)
    cond = Condition("whole-batch ARM", interventions=(whole,))
    lp.evaluate(tiny, problems(), [cond], batch_size=3, max_new_tokens=4, progress=False)
    assert calls == [([False], 1, None)] * len(QUESTIONS)
