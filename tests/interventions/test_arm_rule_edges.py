"""ARM's default rule at its edges, where a wrong comparison changes which entries move: ``c=0`` (an
empty near-zero band), entries exactly at the band's edge ``|a| == eps`` (outside: the band is
``|a| < eps``), exact ties at the last moved magnitude, and the batched rule (every row's statistics at
once) equal to one call per row, bit for bit, on rows made of these edges."""

import pytest
import torch

from lensprobe.interventions import arm_redistribute
from lensprobe.interventions.arm_rule import arm_redistribute_rows, near_zero_band

WIDE = dict(percentile=95, p_min=0.0, p_max=1.0, k=1)  # the moved share is the near-zero share itself
# 14 entries around 1: they hold the median of |a| and of its deviations, so entries below 0.5 set
# neither the median nor the MAD: eps = 1.4826 * MAD * c whatever they are.
SPREAD = [1.0, -1.0625, 0.9375, 1.125, -0.875, 1.1875, 0.8125, -1.25, 0.75, 1.3125, -0.6875, 1.375, 0.625, -1.5]
C_EDGE = 0.5


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def moved(out: torch.Tensor, a: torch.Tensor) -> list[int]:
    return torch.nonzero(out != a).reshape(-1).tolist()


def six_zeros() -> torch.Tensor:
    """Six exact zeros (indices 0-5) before the 14 entries around 1."""
    return torch.tensor([0.0] * 6 + SPREAD)


def at_the_edge() -> tuple[torch.Tensor, float]:
    """Two zeros (indices 0, 1), then four entries with ``|a|`` exactly ``eps`` of ``c=C_EDGE``
    (indices 2-5, signs alternating), then the 14 around 1; and that ``eps``."""
    eps = float(near_zero_band(torch.tensor([0.0, 0.0, 0.1, -0.1, 0.1, -0.1] + SPREAD), C_EDGE))
    a = torch.tensor([0.0, 0.0, eps, -eps, eps, -eps] + SPREAD)
    assert float(near_zero_band(a, C_EDGE)) == eps  # the four entries sit exactly on the edge
    return a, eps


def test_c_zero_makes_the_band_empty_even_for_exact_zeros():
    """``eps = 0`` when ``c = 0``: no entry has ``|a| < 0``, so the moved share is ``p_min`` (here 0) and
    the ``max(1, ...)`` rule moves one entry, a zero; counting ``|a| <= eps`` would move all six."""
    a = six_zeros()
    out = arm_redistribute(a, c=0.0, generator=gen(0), **WIDE)
    assert len(moved(out, a)) == 1 and moved(out, a)[0] < 6
    assert 0 < float(out[moved(out, a)[0]]) <= 1.375  # a zero moves up (0 counts as positive), below the target
    two = arm_redistribute(a, c=0.0, generator=gen(0), **{**WIDE, "p_min": 0.1})  # round(0.1 * 20) = 2
    assert len(moved(two, a)) == 2 and max(moved(two, a)) < 6
    rows = torch.stack([a, a.flip(0)])
    together = arm_redistribute_rows(rows, [gen(0), gen(1)], c=0.0, **WIDE)
    assert [len(moved(together[b], rows[b])) for b in range(2)] == [1, 1]


def test_entries_exactly_at_eps_are_outside_the_band():
    """Two zeros below ``eps`` and four entries at exactly ``eps``: the near-zero share is 2/20, so the
    two zeros move (topk's two smallest) and the four stay, bit for bit; with ``<=`` six would move."""
    a, eps = at_the_edge()
    out = arm_redistribute(a, c=C_EDGE, generator=gen(3), **WIDE)
    assert moved(out, a) == [0, 1]
    assert torch.equal(out[2:], a[2:])
    together = arm_redistribute_rows(torch.stack([a, -a]), [gen(3), gen(4)], c=C_EDGE, **WIDE)
    assert moved(together[0], a) == [0, 1] and moved(together[1], -a) == [0, 1]
    just_above = a.clone()
    just_above[2:6] = just_above[2:6] * (1 - 2**-20)  # now strictly inside the band: all six move
    assert float(near_zero_band(just_above, C_EDGE)) == eps
    assert moved(arm_redistribute(just_above, c=C_EDGE, generator=gen(3), **WIDE), just_above) == list(range(6))


@pytest.mark.parametrize("mode", ["replace", "add"])
def test_exact_ties_move_exactly_n_entries_of_the_tied_set(mode):
    """Five entries share the smallest magnitude (signs mixed) and two move: exactly two, both from
    the tied five, each keeping its sign; every other entry is untouched."""
    tied = [0.25, -0.25, 0.25, -0.25, 0.25]
    a = torch.tensor(tied + SPREAD + [2.0])  # 20 entries
    out = arm_redistribute(a, c=0.0, generator=gen(5), **{**WIDE, "p_min": 0.1}, mode=mode)  # n = 2
    where = moved(out, a)
    assert len(where) == 2 and set(where) <= set(range(5))
    for i in where:
        shift = out[i] if mode == "replace" else out[i] - a[i]
        assert torch.sign(shift) == torch.sign(a[i]) or shift == 0
    keep = [i for i in range(20) if i not in where]
    assert torch.equal(out[keep], a[keep])


@pytest.mark.parametrize("mode", ["replace", "add"])
@pytest.mark.parametrize("c", [0.0, C_EDGE])
def test_rows_at_once_equal_one_call_per_row_at_the_edges(c, mode):
    """The batched rule on rows of exact zeros, entries at the band's edge, ties and constant rows
    equals :func:`arm_redistribute` on each row alone, values and draws, bit for bit."""
    a, _ = at_the_edge()
    rows = torch.stack([six_zeros(), a, -a, torch.tensor([0.25, -0.25] * 3 + SPREAD), torch.zeros(20),
                        torch.full((20,), -0.5), torch.tensor([1e-30] * 10 + [-1e-30] * 10)])
    for rule in (WIDE, {**WIDE, "p_min": 0.1, "p_max": 0.2}, {**WIDE, "k": 3.0}):
        together = arm_redistribute_rows(rows, [gen(b) for b in range(len(rows))], c=c, mode=mode, **rule)
        for b, row in enumerate(rows):
            alone = arm_redistribute(row, c=c, mode=mode, generator=gen(b), **rule)
            assert torch.equal(together[b], alone), (rule, b)
