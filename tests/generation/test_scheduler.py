"""Continuous batching's parts apart from the forwards: the :class:`~lensprobe.generation.batching.scheduler.Scheduler`'s
decisions (row order, row budget, mode, static batches, fallback) on hand-made rows, and each row's
:data:`~lensprobe.generation.batching.rowstate.RowStatus` through a whole generation, read as each row is reported
(``waiting`` -> ``prefilling`` -> ``decoding`` -> ``finished``, never back but on a fallback)."""

import pytest
import torch

import lensprobe as lp
from lensprobe.generation.batching import cacherows
from lensprobe.generation.batching.rowstate import Live, Running
from lensprobe.generation.batching.scheduler import Scheduler
from lensprobe.generation.step import Step

# prompt lengths 3, 5, 5, 1: row r is prompt r (one sample each)
ITEMS = [([1] * 3, None), ([1] * 5, None), ([2] * 5, None), ([1], None)]
ROWS = [(pi, 0) for pi in range(len(ITEMS))]


def schedule(batch_size, refill=True, longest_first=True, records=False, interventions=(), runnable=None):
    return Scheduler(ITEMS, ROWS, list(range(4)) if runnable is None else runnable, batch_size, refill,
                     longest_first, records, list(interventions))


def test_rows_wait_longest_prompt_first_ties_in_row_order_when_they_do_not_fit():
    s = schedule(2)
    assert s.order == [1, 2, 0, 3] and s.longest_first and s.mode == "refill"
    assert s.batches_of(s.order) == [[1, 2], [0, 3]]
    assert s.describe() == {"batching": "continuous batching", "batch_size": 2, "longest_first": True}


@pytest.mark.parametrize("batch_size", [None, 4, 9])
def test_one_batch_of_every_row_keeps_the_row_order(batch_size):
    s = schedule(batch_size)
    assert s.order == [0, 1, 2, 3] and s.batch_size == 4 and not s.longest_first and s.mode == "static"
    assert s.batches_of(s.order) == [[0, 1, 2, 3]]


def test_the_budget_counts_runnable_rows_only():
    s = schedule(3, runnable=[0, 3])
    assert s.batch_size == 2 and s.order == [0, 3] and s.mode == "static"
    assert schedule(None, runnable=[]).batch_size == 1


@pytest.mark.parametrize("kw", [dict(refill=False), dict(records=True)])
def test_static_batches_without_refill_or_with_recording(kw):
    s = schedule(3, **kw)
    assert s.mode == "static" and s.fallback is None
    assert s.batches_of(s.order) == [[1, 2, 0], [3]]


def test_an_intervention_that_depends_on_the_batch_means_static_batches_with_the_reason():
    s = schedule(2, interventions=[lp.ARM(c=0.1, percentile=95, per_row=False)])
    assert s.mode == "static" and not s.admits(None)
    assert s.describe()["batching"] == "static batches (ARM depends on the batch: no continuous batching)"


def test_admits_while_a_place_is_free_and_not_after_a_refusal():
    def running(n):
        z = torch.zeros(n, dtype=torch.long)
        live = Live(z, z, z, torch.ones(n, dtype=torch.bool), z, z, torch.ones((n, 3), dtype=torch.long))
        return Running(live, None, z, z.bool(), torch.zeros((n, 8)), None)

    s = schedule(2)
    assert s.admits(None) and s.admits(running(1)) and not s.admits(running(2))
    s.refuse("a QuantizedCache cannot take rows in and out")
    assert not s.admits(None)
    assert s.describe()["batching"] == "static batches (a QuantizedCache cannot take rows in and out)"


def test_the_queue_gives_rows_in_order_while_there_is_room_and_takes_one_back_first():
    z = torch.zeros(2, dtype=torch.long)
    full = Running(Live(z, z, z, torch.ones(2, dtype=torch.bool), z, z, torch.ones((2, 3), dtype=torch.long)),
                   None, z, z.bool(), torch.zeros((2, 8)), None)
    s = schedule(2)
    assert s.next_row(full) is None and list(s.waiting) == [1, 2, 0, 3]  # no room: nothing taken
    assert [s.next_row(None), s.next_row(None)] == [1, 2] and list(s.waiting) == [0, 3]
    s.put_back(2, "a QuantizedCache cannot take rows in and out")
    assert list(s.waiting) == [2, 0, 3] and s.next_row(None) is None  # refused: no row joins any more
    assert s.describe()["batching"] == "static batches (a QuantizedCache cannot take rows in and out)"


def statuses_at_each_report(monkeypatch) -> list:
    """``(row reported, every row's status then)`` as each row is reported; every row that starts its
    prompt forward must be waiting then (checked as it starts)."""
    seen = []
    report, start_rows = Step.report, Step.start_rows

    def spy(self, r):
        seen.append((r, list(self.status)))
        report(self, r)

    def starting(self, rows):
        assert [self.status[r] for r in rows] == ["waiting"] * len(rows), (rows, self.status)
        start_rows(self, rows)

    monkeypatch.setattr(Step, "report", spy)
    monkeypatch.setattr(Step, "start_rows", starting)
    return seen


@pytest.fixture(scope="module")
def prompts(tiny):
    return [lp.build_prompt(tiny, t) for t in ("What is 12+7?", "x", "the cat sat on the mat", "0 1 2", "a b")]


def test_each_row_waits_prefills_decodes_and_finishes_in_turn(tiny, prompts, monkeypatch):
    seen = statuses_at_each_report(monkeypatch)
    caps = [4, 2, 6, 3, 5]
    out = lp.generate(tiny, prompts, max_new_tokens=6, caps=caps, batch_size=2, stop_at_eos=False,
                      on_row=lambda row: None)
    assert out.meta["batching"] == "continuous batching"
    order = sorted(range(5), key=lambda r: -len(prompts[r]))
    assert sorted(r for r, _ in seen) == list(range(5))
    for k, (r, status) in enumerate(seen):
        assert status[r] == "finished"
        assert {seen[j][0] for j in range(k + 1)} == {i for i, s in enumerate(status) if s == "finished"}
        assert set(status) <= {"waiting", "decoding", "finished"}  # prefilled rows have chosen their token
        assert status.count("decoding") <= 1  # the other place is the reported row's
        waiting = [status[i] == "waiting" for i in order]
        assert waiting == sorted(waiting)  # rows leave the queue in its order
    assert seen[-1][1] == ["finished"] * 5


def test_an_error_row_is_finished_before_any_forward(tiny, prompts, monkeypatch):
    seen = statuses_at_each_report(monkeypatch)
    long = [5] * (int(tiny.cfg.n_ctx) - 4 + 1)  # with 4 new tokens, one beyond the context
    out = lp.generate(tiny, [prompts[0], long, prompts[1]], max_new_tokens=4, batch_size=1, on_error="row",
                      on_row=lambda row: None)
    assert out.finish_reasons[1] == "error"
    assert seen[0] == (1, ["waiting", "finished", "waiting"])
    assert seen[-1][1] == ["finished"] * 3


def test_a_row_put_back_by_the_fallback_waits_again(tiny, prompts, monkeypatch):
    seen = statuses_at_each_report(monkeypatch)
    monkeypatch.setattr(cacherows, "can_join", lambda cache: False)
    out = lp.generate(tiny, prompts[:3], max_new_tokens=3, caps=[3, 1, 2], batch_size=2, stop_at_eos=False,
                      on_row=lambda row: None)
    assert "static batches" in out.meta["batching"]
    # the first row, prefilled alone, goes back to the queue (waiting: it starts again, in the static
    # batch of the two longest, which runs first)
    order = sorted(range(3), key=lambda r: -len(prompts[r]))
    r, status = seen[0]
    assert r in order[:2] and status[order[2]] == "waiting"
    assert seen[-1][1] == ["finished"] * 3
