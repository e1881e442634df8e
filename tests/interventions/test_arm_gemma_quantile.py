"""ARM's Gemma-3 rule equals the authors' function bit for bit, their ``torch.quantile`` thresholds included.

The oracle below is written from the steps of ``arm`` in the authors' ``modeling_gemma3.py`` (fraction = c
in the activations' dtype, thresholds by ``torch.quantile`` on ``|a|`` in float32, the mask, targets and
``rand_like`` draws in the activations' dtype); it shares no code with lensprobe's rule.
"""

import pytest
import torch

from lensprobe.interventions.arm_rule import arm_redistribute, torch_quantile


def authors_gemma_rule(act: torch.Tensor, c: float, percentage: float) -> torch.Tensor:
    y = act.clone()
    dtype = y.dtype
    abs_x = act.abs()
    abs_x_f32 = abs_x.to(torch.float32)
    fraction = torch.tensor(c, device=y.device, dtype=y.dtype)
    q = torch.clamp(fraction, 0.0, 1.0).to(torch.float32)
    tau = torch.quantile(abs_x_f32.flatten(), q).to(dtype)
    mask = abs_x <= tau
    if percentage > 1:
        percentage /= 100
    max_target = torch.quantile(abs_x_f32.flatten(), torch.tensor(percentage)).to(dtype)
    y_flat = y.view(-1)
    neg_mask = y_flat < 0
    min_neg_val = torch.where(neg_mask, y_flat, torch.full_like(y_flat, float("inf"))).min()
    has_neg = neg_mask.any().to(y_flat.dtype)
    abs_min_neg = (has_neg * min_neg_val + (1 - has_neg) * torch.zeros((), dtype=y_flat.dtype)).abs()
    signs = torch.sign(y)
    signs = torch.where(signs == 0, torch.ones_like(signs), signs)
    rand_u = torch.rand_like(y, dtype=torch.float32).to(dtype)
    target = torch.where(signs > 0, rand_u * max_target, rand_u * abs_min_neg)
    return torch.where(mask, signs * target, y)


def _tensors():
    g = torch.Generator().manual_seed(0)
    out = []
    for shape in [(1, 7, 64), (1, 33, 96), (1, 1, 128), (1, 200, 48)]:
        out.append(torch.randn(shape, generator=g) * 0.3)
        # ties: few distinct magnitudes, zeros and both signs, so thresholds fall on repeated values
        out.append(torch.randint(-4, 5, shape, generator=g).float() / 8)
        out.append(torch.nn.functional.silu(torch.randn(shape, generator=g)).to(torch.bfloat16))
    return out


@pytest.mark.parametrize("i", range(12))
@pytest.mark.parametrize(("c", "pct"), [(0.13, 99.5), (0.25, 0.85), (0.25, 96.5), (0.5, 0.965), (0.25, 70.0)])
def test_gemma_rule_equals_the_authors_function_bit_for_bit(i, c, pct):
    act = _tensors()[i]
    torch.manual_seed(1234)
    expected = authors_gemma_rule(act, c, pct)
    torch.manual_seed(1234)
    got = arm_redistribute(act, c=c, percentile=pct, variant="gemma")
    assert got.dtype == act.dtype
    assert torch.equal(got.view(torch.int16) if got.dtype == torch.bfloat16 else got.view(torch.int32),
                       expected.view(torch.int16) if got.dtype == torch.bfloat16 else expected.view(torch.int32))


def test_torch_quantile_equals_torch_bit_for_bit_on_random_and_tied_values():
    g = torch.Generator().manual_seed(1)
    qs = [0.0, 0.13, 0.25, 0.5, 0.7, 0.85, 0.965, 0.995, 1.0] + torch.rand(40, generator=g).tolist()
    for n in (1, 2, 3, 10, 97, 1000, 4097):
        for values in (torch.rand(n, generator=g), torch.randint(0, 5, (n,), generator=g).float() / 3):
            for q in qs:
                qt = torch.tensor(q, dtype=torch.float32)
                assert torch_quantile(values, qt).view(torch.int32) == torch.quantile(values, qt).view(torch.int32), (n, q)


def test_the_linear_formula_in_float64_differs_where_torch_rounds():
    """Why the rank is taken in float32 and the interpolation is ``torch.lerp``: the textbook formula in
    float64 (lensprobe's rule before) differs from ``torch.quantile`` on about half of these tensors, so the
    bit-for-bit test above tells the two apart."""
    g = torch.Generator().manual_seed(2)
    differ = total = 0
    for n in (448, 3168, 9600):
        for _ in range(10):
            v = torch.nn.functional.silu(torch.randn(n, generator=g)).abs()
            s = v.sort().values
            for q in (0.13, 0.25, 0.85, 0.965, 0.995):
                pos = q * (n - 1)
                lo = int(pos)
                textbook = s[lo] + (s[min(lo + 1, n - 1)] - s[lo]) * (pos - lo)
                differ += int(textbook != torch.quantile(v, torch.tensor(q)))
                total += 1
    assert differ > total // 4
