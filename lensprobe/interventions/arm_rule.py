r"""ARM's rule: how the activation redistribution module of the meaningless-tokens paper
(arXiv 2510.01032) moves near-zero activations (the intervention is :class:`lensprobe.ARM`).

The paper explains the gain from filler tokens by a redistribution of layer-0 MLP
activations away from zero, and reproduces it without filler by editing those activations
directly. ARM works on ``a = act_fn(gate_proj(x))``, the gated MLP's activation before it is
multiplied by ``up_proj(x)``, so the MLP computes ``down_proj(ARM(a) * up_proj(x))``.

The rule (the authors' released code, ``variant="default"``), on the whole tensor passed in:

1. ``eps = 1.4826 * MAD(|a|) * c``, where ``MAD = median(| |a| - median(|a|) |)`` (clamped at
   ``1e-12``); medians are ``torch.median``'s (the lower middle value for an even count).
2. ``fraction = clamp(k * mean(|a| < eps), p_min, p_max)``; ``n = max(1, round(fraction * a.numel()))``
   (Python's ``round``: halves go to the even integer).
3. The ``n`` entries with the smallest ``|a|`` (``torch.topk(largest=False)`` on the flattened
   ``|a|``, so ties are broken as topk breaks them) move to ``sign * u * target`` with
   ``u ~ U(0, 1)``: one ``torch.rand`` draw per moved entry, in topk's order (smallest
   ``|a|`` first). ``sign`` is the entry's sign, 0 counting as positive. ``target`` is the
   ``percentile``-th percentile of all entries of ``a`` (linear interpolation, as
   ``numpy.percentile``) for positive entries, and ``|min a|`` over the negative entries
   for negative ones (0 when there are none).
4. Every other entry is returned unchanged, bit for bit.

``mode="add"`` adds the shift to the original value instead (``a + sign * u * target``): the
paper's text says the values are "added", its code replaces them; the default follows the
code.

``variant="gemma"`` is the authors' Gemma-3 rule: ``fraction = c`` directly (``p_min``,
``p_max`` and ``k`` are unused); the entries with ``|a| <= quantile(|a|, c)`` move (a
threshold, so ties at the threshold all move); ``target`` for positive entries is
``quantile(|a|, percentile)`` of the *absolute* values with ``percentile`` in ``[0, 1]``
(a value above 1 is divided by 100); one ``u`` is drawn for every entry of the tensor (its
shape), and the moved entries use theirs. The quantiles are ``torch.quantile``'s, bit for bit
(:func:`torch_quantile`: the rank ``q * (n - 1)`` in float32, ``torch.lerp``), of ``|a|`` in
float32 with ``c`` rounded to the activations' dtype first, and the threshold, targets and draws
are in the activations' dtype, as the authors' function computes them. One difference: on a tensor
of more than 2**24 entries ``torch.quantile`` refuses and the authors' function falls back to a
1000-bin histogram (with 0.9 in place of the target's quantile); lensprobe computes the exact
quantile there (a Gemma-3-27B prompt forward reaches 2**24 entries at 781 positions).

Consequences worth knowing:

- ``p_min = p_max = 0`` still moves exactly one entry (the ``max(1, ...)`` rule).
- :func:`arm_redistribute` computes its statistics over the whole tensor it is given, as the
  authors' code does on a batch of one. :class:`lensprobe.ARM` gives it one batch row at a time by
  default (``per_row=True``, padding left out), which is the authors' one-problem-at-a-time
  semantics, batched; ``per_row=False`` passes the whole batch (a row's result then depends
  on its neighbours). Under a KV cache, a decode step's tensor is one position, so the
  statistics of each step are those of that single position (the prompt forward sees all
  prompt positions at once).
- Statistics are computed in float32; the result has the input's dtype. The input is never
  modified.
- Without ``generator`` (or ``seed``) the draws come from torch's global generator, as in
  the authors' code, so two runs differ.
"""

import math
from collections.abc import Sequence
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

from lensprobe.core.errors import LensprobeError

__all__ = ["MAD_SCALE", "Mode", "Variant", "arm_redistribute", "arm_redistribute_rows", "check_rule", "near_zero_band",
           "torch_quantile"]

Mode = Literal["replace", "add"]
Variant = Literal["default", "gemma"]
_MODES = ("replace", "add")
_VARIANTS = ("default", "gemma")
MAD_SCALE = 1.4826
"""Scale that makes the median absolute deviation a standard deviation for normal data."""


def arm_redistribute(activations: Float[Tensor, "..."], *, c: float, percentile: float,
                     p_min: float = 0.02, p_max: float = 0.25, k: float = 1, mode: Mode = "replace",
                     variant: Variant = "default",
                     generator: torch.Generator | None = None) -> Float[Tensor, "..."]:
    r"""Move the near-zero entries of ``activations`` away from zero (the paper's ARM rule).

    See the module docstring for the rule step by step. Statistics are over the whole
    tensor (every batch row and position together).

    Args:
        activations: ``act_fn(gate_proj(x))`` of a gated MLP, any shape (usually
            ``[batch, pos, d_mlp]``). Not modified.
        c: scale of the near-zero band ``eps = 1.4826 * MAD(|a|) * c`` (``variant="gemma"``:
            the fraction of entries to move, in ``[0, 1]``).
        percentile: percentile of ``a`` (0-100) that bounds the new positive values
            (``variant="gemma"``: quantile of ``|a|`` in ``[0, 1]``; above 1 it is divided by 100).
        p_min, p_max: bounds of the moved fraction (at least one entry always moves).
        k: multiplier of the near-zero share before clamping.
        mode: ``"replace"`` (the authors' code) or ``"add"`` (the paper's text).
        variant: ``"default"`` or ``"gemma"`` (the authors' Gemma-3 rule).
        generator: source of the uniform draws (``None``: torch's global generator). It must
            live on the activations' device.

    Returns:
        A new tensor of the input's shape and dtype.

    Raises:
        LensprobeError: a bad argument or an empty tensor.

    Example:
        >>> a = torch.tensor([[-0.3, 0.001, 2.0, -0.002, 0.5, 1.2, 0.0004, -1.0]])
        >>> out = arm_redistribute(a, c=0.1, percentile=95, generator=torch.Generator().manual_seed(0))
        >>> int((out != a).sum())  # round(0.25 * 8) = 2 entries moved
        2
    """
    check_rule(c, percentile, p_min, p_max, k, mode, variant)
    if not isinstance(activations, Tensor) or not activations.is_floating_point():
        raise LensprobeError(
            f"activations must be a floating-point tensor, got {type(activations).__name__}"
            f"{'' if not isinstance(activations, Tensor) else ' of dtype ' + str(activations.dtype)}."
        )
    if activations.numel() == 0:
        raise LensprobeError("activations is empty: ARM needs at least one entry.")
    if generator is not None and generator.device != activations.device and not (
            generator.device.type == activations.device.type == "cpu"):
        raise LensprobeError(
            f"the generator is on {generator.device} but the activations are on "
            f"{activations.device}: create it with torch.Generator(device=activations.device)."
        )
    if variant == "gemma":
        return _redistribute_gemma(activations, c, percentile, mode, generator)
    return _redistribute_default(activations, c, percentile, p_min, p_max, k, mode, generator)


def near_zero_band(flat: Float[Tensor, " n"], c: float) -> Tensor:
    """ARM's near-zero band ``eps = 1.4826 * MAD(|a|) * c`` of a flat float32 tensor (a 0-d tensor).

    ``MAD = median(| |a| - median(|a|) |)``, clamped at ``1e-12``; ``torch.median`` takes the
    lower middle value for an even count.
    """
    magnitude = flat.abs()
    mad = (magnitude - magnitude.median()).abs().median().clamp_min(1e-12)
    return MAD_SCALE * mad * c


def _redistribute_default(a: Tensor, c: float, percentile: float, p_min: float, p_max: float,
                          k: float, mode: str, generator) -> Tensor:
    flat = a.detach().reshape(-1).to(torch.float32)
    magnitude = flat.abs()
    eps = near_zero_band(flat, c)
    near_zero = (magnitude < eps).to(torch.float32).mean()
    fraction = float(torch.clamp(k * near_zero, min=p_min, max=p_max))
    total = flat.numel()
    n = min(total, max(1, int(round(fraction * total))))
    _, idx = torch.topk(magnitude, n, largest=False)
    pos_target = _quantile(flat, percentile / 100.0)
    negative = flat[flat < 0]
    neg_target = negative.min().abs() if negative.numel() else flat.new_zeros(())
    chosen = flat[idx]
    signs = torch.where(chosen < 0, -1.0, 1.0).to(torch.float32)
    u = torch.rand(n, generator=generator, device=flat.device, dtype=torch.float32)
    shift = signs * u * torch.where(signs > 0, pos_target, neg_target)
    new = shift if mode == "replace" else chosen + shift
    out = a.detach().reshape(-1).clone()
    out[idx] = new.to(a.dtype)
    return out.view_as(a)


def arm_redistribute_rows(rows: Float[Tensor, "batch n"], generators: Sequence[torch.Generator | None], *,
                          c: float, percentile: float, p_min: float = 0.02, p_max: float = 0.25, k: float = 1,
                          mode: Mode = "replace") -> Float[Tensor, "batch n"]:
    """:func:`arm_redistribute` (``variant="default"``) on each row of ``rows`` alone, row ``b``
    drawing from ``generators[b]``: the same values and draws as one call per row, with the
    statistics of all rows computed at once (what per-row ARM runs at every decode step).

    Example:
        >>> gens = [torch.Generator().manual_seed(0) for _ in range(2)]
        >>> out = arm_redistribute_rows(torch.randn(2, 16), gens, c=0.1, percentile=95)
    """
    check_rule(c, percentile, p_min, p_max, k, mode, "default")
    if rows.dim() != 2 or rows.shape[1] == 0 or len(generators) != rows.shape[0]:
        raise LensprobeError(f"rows must be [batch, n] with n >= 1 and one generator per row, got "
                             f"{tuple(rows.shape)} and {len(generators)} generators.")
    flat = rows.detach().to(torch.float32)
    magnitude = flat.abs()
    mad = (magnitude - magnitude.median(dim=1, keepdim=True).values).abs().median(dim=1).values.clamp_min(1e-12)
    eps = MAD_SCALE * mad * c
    fractions = torch.clamp(k * (magnitude < eps[:, None]).to(torch.float32).mean(dim=1), min=p_min, max=p_max)
    total = flat.shape[1]
    pos_target = _quantile_rows(flat, percentile / 100.0)
    lowest = torch.where(flat < 0, flat, torch.inf).amin(dim=1)
    neg_target = torch.where(torch.isinf(lowest), torch.zeros_like(lowest), lowest.abs())
    out = rows.detach().clone()
    for b, (fraction, gen) in enumerate(zip(fractions.tolist(), generators, strict=True)):
        n = min(total, max(1, int(round(fraction * total))))
        _, idx = torch.topk(magnitude[b], n, largest=False)
        chosen = flat[b, idx]
        signs = torch.where(chosen < 0, -1.0, 1.0).to(torch.float32)
        u = torch.rand(n, generator=gen, device=flat.device, dtype=torch.float32)
        shift = signs * u * torch.where(signs > 0, pos_target[b], neg_target[b])
        out[b, idx] = (shift if mode == "replace" else chosen + shift).to(rows.dtype)
    return out


def _quantile_rows(values: Tensor, q: float) -> Tensor:
    """:func:`_quantile` of each row of a 2-D tensor."""
    n = values.shape[1]
    position = q * (n - 1)
    lo = int(math.floor(position))
    hi = min(lo + 1, n - 1)
    low = values.kthvalue(lo + 1, dim=1).values
    if hi == lo or position == lo:
        return low
    high = values.kthvalue(hi + 1, dim=1).values
    return low + (high - low) * (position - lo)


def _redistribute_gemma(a: Tensor, c: float, percentile: float, mode: str, generator) -> Tensor:
    """The authors' Gemma-3 rule, step by step as their ``arm`` computes it: the thresholds in float32 by
    :func:`torch_quantile`, the comparison, targets and draws in the activations' dtype."""
    dtype, device = a.dtype, a.device
    y = a.detach()
    magnitude = y.abs()
    flat32 = magnitude.reshape(-1).to(torch.float32)
    fraction = torch.tensor(float(c), device=device, dtype=dtype).clamp(0.0, 1.0).to(torch.float32)
    mask = magnitude <= torch_quantile(flat32, fraction).to(dtype)
    q = percentile / 100 if percentile > 1 else percentile
    pos_target = torch_quantile(flat32, torch.tensor(q, device=device, dtype=torch.float32)).to(dtype)
    negative = y < 0
    neg_target = torch.where(negative, y, torch.full_like(y, math.inf)).min().abs() if bool(negative.any()) \
        else y.new_zeros(())
    signs = torch.where(y < 0, -1.0, 1.0).to(dtype)
    u = torch.rand(tuple(a.shape), generator=generator, device=device, dtype=torch.float32).to(dtype)
    shift = signs * torch.where(signs > 0, u * pos_target, u * neg_target)
    return torch.where(mask, shift if mode == "replace" else y + shift, y)


def torch_quantile(values: Float[Tensor, " n"], q: Tensor) -> Tensor:
    """``torch.quantile(values, q)`` (linear interpolation) of a 1-D float tensor, for any size.

    Computed as ``torch.quantile`` computes it (``aten/src/ATen/native/Sorting.cpp``): the rank
    ``q * (n - 1)`` in ``q``'s dtype, the values at its floor and ceiling (by selection:
    ``torch.quantile`` refuses more than 2**24 entries), and ``torch.lerp`` between them by the rank's
    fraction, so it equals ``torch.quantile`` bit for bit where that runs. ``q`` is a 0-d tensor of
    ``values``' dtype.

    Example:
        >>> v = torch.rand(1000)
        >>> bool(torch_quantile(v, torch.tensor(0.995)) == torch.quantile(v, torch.tensor(0.995)))
        True
    """
    rank = q * (values.numel() - 1)
    below = rank.long()
    weight = rank - below
    above = rank.ceil().long()
    low = values.kthvalue(int(below) + 1).values
    high = values.kthvalue(int(above) + 1).values
    return torch.lerp(low, high, weight)


def _quantile(values: Tensor, q: float) -> Tensor:
    """``q``-quantile of a 1-D tensor with linear interpolation (``numpy.percentile``'s
    default), by selection, so it works on tensors of any size (``torch.quantile`` refuses
    more than 16 million entries)."""
    n = values.numel()
    position = q * (n - 1)
    lo = int(math.floor(position))
    hi = min(lo + 1, n - 1)
    low = values.kthvalue(lo + 1).values
    if hi == lo or position == lo:
        return low
    high = values.kthvalue(hi + 1).values
    return low + (high - low) * (position - lo)


def check_rule(c, percentile, p_min, p_max, k, mode, variant) -> None:
    if variant not in _VARIANTS:
        raise LensprobeError(f"variant must be one of {_VARIANTS}, got {variant!r}.")
    if mode not in _MODES:
        raise LensprobeError(f"mode must be 'replace' (the authors' code) or 'add' (the paper's text), got {mode!r}.")
    if not _is_real(c) or c < 0:
        raise LensprobeError(f"c must be a non-negative number, got {c!r} (the presets use 0.05-0.32).")
    if variant == "gemma" and c > 1:
        raise LensprobeError(
            f"with variant='gemma', c is the fraction of entries to move and must be in [0, 1], got {c!r}."
        )
    if not _is_real(percentile):
        raise LensprobeError(f"percentile must be a number, got {percentile!r}.")
    if not 0 <= percentile <= 100:
        raise LensprobeError(
            f"percentile must be in [0, 100] (e.g. 99.5), got {percentile!r}." if variant == "default" else
            f"with variant='gemma', percentile is a quantile in [0, 1] (or a percent in (1, 100]), got {percentile!r}."
        )
    for name, value in (("p_min", p_min), ("p_max", p_max)):
        if not _is_real(value) or not 0 <= value <= 1:
            raise LensprobeError(f"{name} must be a fraction in [0, 1], got {value!r}.")
    if p_min > p_max:
        raise LensprobeError(f"p_min ({p_min!r}) must not exceed p_max ({p_max!r}): swap them.")
    if not _is_real(k) or k < 0:
        raise LensprobeError(f"k must be a non-negative number, got {k!r} (the authors use 1).")


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
