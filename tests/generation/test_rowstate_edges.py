"""The running batch keeping some of its rows (:meth:`lensprobe.generation.batching.rowstate.Running.kept`): the rows'
state and cache taken in the order given, and the cache columns that are padding in every kept row dropped
from the cache and the mask. Expected values are indexed and sliced by hand from what the batch held
(``test_cacherows.make`` and ``contents`` build and read the cache)."""

import pytest
import torch
from test_cacherows import KINDS, contents, make

from lensprobe.generation.batching.rowstate import Live, Running

MASK = [[0, 0, 0, 1, 1],
        [0, 1, 1, 1, 1],
        [0, 0, 1, 1, 1]]


def batch(kind: str, hidden: bool) -> Running:
    """Three rows of five cache columns; row ``i`` is padded by ``MASK[i]``'s leading zeros."""
    g = torch.Generator().manual_seed(5)
    live = Live(rows=torch.tensor([7, 8, 9]), steps=torch.tensor([3, 4, 5]), caps=torch.tensor([10, 11, 12]),
                active=torch.tensor([True, False, True]), n_thinking=torch.tensor([0, 1, 2]),
                lengths=torch.tensor([2, 4, 3]), mask=torch.tensor(MASK))
    cache = make(kind, 3, 5, seed=6, pad=[row.index(1) for row in MASK])
    return Running(live, cache, choice=torch.tensor([11, 12, 13]), think=torch.tensor([False, True, False]),
                   last=torch.randn(3, 4, generator=g), hidden=torch.randn(3, 2, generator=g) if hidden else None)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("keep", "lead"), [([2, 0], 2), ([1, 0], 1), ([0], 3), ([1, 2], 1)])
def test_kept_rows_drop_the_columns_that_are_padding_in_every_one_of_them(kind, keep, lead):
    # rows 2 and 0 both start with 2 padding columns, rows 1 and 0 with 1, row 0 alone with 3
    running = batch(kind, hidden=True)
    cache_before = [t.clone() for t in contents(running.cache)]
    last, hidden = running.last.clone(), running.hidden.clone()
    out = running.kept(torch.tensor(keep))
    assert out.live.mask.tolist() == [MASK[i][lead:] for i in keep]
    got = contents(out.cache)
    assert len(got) == len(cache_before)
    for g, t in zip(got, cache_before, strict=True):
        assert torch.equal(g, t[keep][..., lead:, :])
    assert out.live.rows.tolist() == [[7, 8, 9][i] for i in keep]
    assert out.live.steps.tolist() == [[3, 4, 5][i] for i in keep]
    assert out.live.caps.tolist() == [[10, 11, 12][i] for i in keep]
    assert out.live.active.tolist() == [[True, False, True][i] for i in keep]
    assert out.live.lengths.tolist() == [[2, 4, 3][i] for i in keep]
    assert out.choice.tolist() == [[11, 12, 13][i] for i in keep]
    assert torch.equal(out.last, last[keep]) and torch.equal(out.hidden, hidden[keep])


def test_kept_rows_without_common_padding_keep_every_column():
    running = batch("dynamic", hidden=False)
    running.live.mask[1, 0] = 1  # row 1 has no padding: no column is padding in every row kept with it
    out = running.kept(torch.tensor([1, 0]))
    assert out.live.mask.tolist() == [[1, 1, 1, 1, 1], MASK[0]]
    assert all(t.shape[-2] == 5 for t in contents(out.cache)) and out.hidden is None
