"""The report bar's time estimate weights each study by its declared cost: checked on a fake schedule with a fake
clock against the count-of-steps estimate that said 16 s were left when 21 minutes were."""

import io

import pytest

from lensprobe.app.demo import DEMO_SECTIONS
from lensprobe.app.schedule import CostBar, declared_text, remaining_seconds
from lensprobe.core.errors import LensprobeError

SCHEDULE = [("attention", 40.0), ("mechanism", 4.0), ("sinks", 50.0), ("evals", 1260.0)]
"""A fake schedule: three short steps, then one that is most of the run."""


def by_count(n_steps: int, done: int, elapsed: float) -> float:
    """What a bar counting steps (each worth one) estimates: the mean time per step so far, times the steps left."""
    return elapsed / done * (n_steps - done)


def test_the_estimate_scales_the_time_so_far_by_the_cost_left_over_the_cost_done():
    costs = [c for _, c in SCHEDULE]
    # the machine runs at 1.5x the declared costs: each estimate is the true time left
    for done in range(1, len(costs) + 1):
        elapsed = 1.5 * sum(costs[:done])
        truth = 1.5 * sum(costs[done:])
        assert remaining_seconds(costs, done, elapsed) == pytest.approx(truth)
    # after the three short steps, counting steps says 31 s where 1,890 s are left
    elapsed = 1.5 * sum(costs[:3])
    assert by_count(len(costs), 3, elapsed) == pytest.approx(47.0)
    assert remaining_seconds(costs, 3, elapsed) == pytest.approx(1890.0)
    assert remaining_seconds(costs, 0, 0.0) is None  # nothing to scale yet
    assert remaining_seconds(costs, 4, 100.0) == 0.0
    with pytest.raises(LensprobeError, match="done must be from 0 to 4"):
        remaining_seconds(costs, 5, 1.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_bar_shows_the_weighted_estimate():
    """The tqdm bar itself, on a fake clock: its ``remaining`` is the weighted estimate, not the count's."""
    clock, out = FakeClock(), io.StringIO()
    with CostBar(SCHEDULE, desc="report", file=out, mininterval=0) as bar:
        bar.bar._time, bar.bar.start_t = clock, 0.0
        for i, (name, cost) in enumerate(SCHEDULE[:3]):
            bar.start(name)
            clock.now += 2.0 * cost  # a machine twice as slow as the declared costs
            bar.done()
            assert bar.remaining() == pytest.approx(2.0 * sum(c for _, c in SCHEDULE[i + 1:]))
        shown = bar.bar.format_dict
        meter = bar.bar.format_meter(**shown)
    assert "<42:00]" in meter  # 2 x 1260 s = 42 min left, as tqdm prints it
    assert bar.index == 3 and shown["n"] == pytest.approx(94.0)
    first = CostBar(SCHEDULE, desc="report", file=io.StringIO())
    first.start("attention")
    assert "the whole run: about 23 min on a 2-core machine" in first.bar.postfix
    first.close()


def test_a_step_without_a_positive_cost_or_one_too_many_is_refused():
    with pytest.raises(LensprobeError, match="positive cost"):
        CostBar([("a", 1.0), ("b", 0.0)], desc="x", disable=True)
    bar = CostBar([("a", 1.0)], desc="x", disable=True)
    bar.done()
    with pytest.raises(LensprobeError, match="all 1 steps are done"):
        bar.done()


def test_declared_durations_read_as_a_person_says_them():
    assert declared_text(40) == "about 40 s" and declared_text(1488) == "about 25 min"


def test_every_demo_study_declares_a_positive_cost():
    assert all(entry.cost > 0 for entry in DEMO_SECTIONS)
    # the studies differ: a count of studies would misjudge the time left
    costs = sorted(entry.cost for entry in DEMO_SECTIONS)
    assert costs[-1] > 10 * costs[0]
