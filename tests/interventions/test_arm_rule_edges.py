"""ARM's default rule at its edges, where a wrong comparison changes which entries move: ``c=0`` (an
empty near-zero band), entries exactly at the band's edge ``|a| == eps`` (outside: the band is
``|a| < eps``), exact ties at the last moved magnitude, and the batched rule (every row's statistics at
once) equal to one call per row, bit for bit, on rows made of these edges."""

from contextlib import contextmanager

import pytest
import torch
from test_arm_gemma_quantile import authors_gemma_rule

from lensprobe.core.errors import LensprobeError
from lensprobe.interventions import arm_redistribute
from lensprobe.interventions.arm_rule import arm_redistribute_rows, near_zero_band

WIDE = dict(percentile=95, p_min=0.0, p_max=1.0, k=1)  # the moved share is the near-zero share itself
# 14 entries around 1: they hold the median of |a| and of its deviations, so entries below 0.5 set
# neither the median nor the MAD: eps = 1.4826 * MAD * c whatever they are.
SPREAD = [1.0, -1.0625, 0.9375, 1.125, -0.875, 1.1875, 0.8125, -1.25, 0.75, 1.3125, -0.6875, 1.375, 0.625, -1.5]
C_EDGE = 0.5


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@contextmanager
def default_dtype(dtype: torch.dtype):
    """torch's default dtype set to ``dtype`` inside the block (as a program may set it), restored after."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


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


# ----------------------------------------------------------------------------- what mutation testing found
def test_low_precision_input_is_ruled_on_in_float32():
    """Statistics, draws and shifts are float32 whatever the input's dtype: a bfloat16 or float16 input
    gets exactly the float32 rule's result on its values, cast back (unmoved entries round-trip exactly)."""
    a = torch.randn(4, 48, generator=gen(8)) * 0.3
    for dtype in (torch.bfloat16, torch.float16):
        low = a.to(dtype)
        want = arm_redistribute(low.float(), c=0.2, percentile=95, generator=gen(1)).to(dtype)
        assert torch.equal(arm_redistribute(low, c=0.2, percentile=95, generator=gen(1)), want)
        together = arm_redistribute_rows(low, [gen(b) for b in range(4)], c=0.2, percentile=95)
        assert torch.equal(together, torch.stack([arm_redistribute(low[b].float(), c=0.2, percentile=95,
                                                                   generator=gen(b)).to(dtype) for b in range(4)]))


def test_draws_are_float32_whatever_the_default_dtype():
    """torch's default dtype does not change the draws (they are float32 by name), so a program that
    sets float64 as default gets the same result as one that does not."""
    a = torch.randn(2, 40, generator=gen(2))
    rule = dict(c=0.2, percentile=95)
    want = (arm_redistribute(a, generator=gen(0), **rule), arm_redistribute_rows(a, [gen(0), gen(1)], **rule),
            arm_redistribute(a, variant="gemma", c=0.2, percentile=0.9, generator=gen(0)))
    with default_dtype(torch.float64):
        got = (arm_redistribute(a, generator=gen(0), **rule), arm_redistribute_rows(a, [gen(0), gen(1)], **rule),
               arm_redistribute(a, variant="gemma", c=0.2, percentile=0.9, generator=gen(0)))
    for x, y in zip(want, got, strict=True):
        assert torch.equal(x, y)


def test_add_mode_sums_in_float32_whatever_the_default_dtype_and_the_inputs_dtype():
    """In mode='add' the signs, shifts and sums are float32: under a float64 default dtype a float32 input
    gets the result it gets under float32 (the sum rounded once, in float32), and a float64 input gets, at
    the entries moved, the float32 rule's result on its values cast to float32, and its own values elsewhere."""
    a = torch.randn(3, 200, generator=gen(9))
    rule = dict(c=0.3, percentile=95, mode="add")
    want = [arm_redistribute(a[b], generator=gen(b), **rule) for b in range(3)]
    wide = a.double() + 1e-9 * torch.rand(3, 200, generator=gen(10), dtype=torch.float64)  # not float32 values
    want_wide = []
    for b in range(3):
        ruled = arm_redistribute(wide[b].float(), generator=gen(b), **rule)
        where = moved(ruled, wide[b].float())
        assert len(where) > 10  # the rule moves entries here
        row = wide[b].clone()
        row[where] = ruled[where].double()
        want_wide.append(row)
    with default_dtype(torch.float64):
        for x, expected in ((a, torch.stack(want)), (wide, torch.stack(want_wide))):
            assert torch.equal(torch.stack([arm_redistribute(x[b], generator=gen(b), **rule) for b in range(3)]),
                               expected)
            assert torch.equal(arm_redistribute_rows(x, [gen(b) for b in range(3)], **rule), expected)


@pytest.mark.parametrize("make", ["float64", "bfloat16 without negatives"])
def test_gemma_rule_equals_the_authors_on_float64_and_on_nonnegative_input(make):
    """The authors' function (test_arm_gemma_quantile) takes the thresholds in float32 whatever the input's
    dtype: a float64 input's thresholds and targets are its float32 quantiles, cast back; and an input with
    no negative entry has a negative target of 0."""
    x = torch.randn(4, 65, generator=gen(11), dtype=torch.float64)
    act = x if make == "float64" else torch.nn.functional.softplus(x).to(torch.bfloat16)
    for c, pct in ((0.25, 90.0), (0.5, 0.965)):
        torch.manual_seed(7)
        expected = authors_gemma_rule(act, c, pct)
        torch.manual_seed(7)
        got = arm_redistribute(act, c=c, percentile=pct, variant="gemma")
        assert got.dtype == act.dtype and torch.equal(got, expected)
        assert int((got != act).sum()) >= 4 * 65 * c - 4  # the entries at or below the c-quantile moved


def test_the_batched_rule_has_the_row_rules_defaults_and_takes_one_entry_rows():
    a = torch.randn(3, 64, generator=gen(4)) * 0.1
    a[:, :20] = 0.0  # a near-zero share above p_max: the clamp and k matter
    together = arm_redistribute_rows(a, [gen(b) for b in range(3)], c=0.3, percentile=95)
    assert all(torch.equal(together[b], arm_redistribute(a[b], c=0.3, percentile=95, generator=gen(b)))
               for b in range(3))
    one = torch.tensor([[0.5], [-2.0]])
    assert torch.equal(arm_redistribute_rows(one, [gen(0), gen(1)], c=0.1, percentile=95),
                       torch.stack([arm_redistribute(one[b], c=0.1, percentile=95, generator=gen(b)) for b in range(2)]))


def test_gemma_add_mode_adds_the_shift_and_percent_or_fraction_at_1_and_2():
    a = torch.randn(64, generator=gen(6))
    replaced = arm_redistribute(a, c=0.25, percentile=0.9, variant="gemma", generator=gen(3))
    added = arm_redistribute(a, c=0.25, percentile=0.9, variant="gemma", mode="add", generator=gen(3))
    where = moved(replaced, a)
    assert len(where) == 16 and moved(added, a) == where
    assert torch.equal(added[where], a[where] + replaced[where])
    for percent, fraction in ((1, 1.0), (2, 0.02), (100, 1.0)):  # above 1 a percent, else a fraction
        assert torch.equal(arm_redistribute(a, c=0.25, percentile=percent, variant="gemma", generator=gen(3)),
                           arm_redistribute(a, c=0.25, percentile=fraction, variant="gemma", generator=gen(3)))


@pytest.mark.unchecked
def test_every_refusal_says_exactly_what_was_wrong():
    """The rule's own messages, word for word, for inputs outside the annotations too (what a caller
    without a type checker sees; the intervention's messages are tested in test_arm.py)."""
    def message(call) -> str:
        with pytest.raises(LensprobeError) as err:
            call()
        return str(err.value)

    ok = dict(c=0.1, percentile=95)
    assert message(lambda: arm_redistribute(torch.zeros(0), **ok)) == "activations is empty: ARM needs at least one entry."
    assert message(lambda: arm_redistribute([0.5, 1.0], **ok)) == (
        "activations must be a floating-point tensor, got list.")  # not a tensor: no dtype to name
    assert message(lambda: arm_redistribute(torch.zeros(3, dtype=torch.int64), **ok)) == (
        "activations must be a floating-point tensor, got Tensor of dtype torch.int64.")
    assert message(lambda: arm_redistribute(torch.zeros(3, device="meta"), generator=gen(0), **ok)) == (
        "the generator is on cpu but the activations are on meta: create it with "
        "torch.Generator(device=activations.device).")
    assert message(lambda: arm_redistribute(torch.zeros(3), c=0.1, percentile="high")) == (
        "percentile must be a number, got 'high'.")
    assert message(lambda: arm_redistribute(torch.zeros(3), c=0.1, percentile=100.5)) == (
        "percentile must be in [0, 100] (e.g. 99.5), got 100.5.")
    assert message(lambda: arm_redistribute(torch.zeros(3), c=0.1, percentile=101, variant="gemma")) == (
        "with variant='gemma', percentile is a quantile in [0, 1] (or a percent in (1, 100]), got 101.")
    assert message(lambda: arm_redistribute(torch.zeros(3), p_min=2.0, **ok)) == (
        "p_min must be a fraction in [0, 1], got 2.0.")
    for bad in (torch.zeros(4), torch.zeros(2, 0)):
        assert message(lambda bad=bad: arm_redistribute_rows(bad, [gen(0)] * len(bad), **ok)) == (
            f"rows must be [batch, n] with n >= 1 and one generator per row, got {tuple(bad.shape)} and "
            f"{len(bad)} generators.")
    # the edges of what is allowed
    for allowed in (dict(percentile=100), dict(k=0), dict(k=0.5), dict(c=1.0, variant="gemma")):
        arm_redistribute(torch.randn(8, generator=gen(0)), **{**ok, **allowed}, generator=gen(0))
