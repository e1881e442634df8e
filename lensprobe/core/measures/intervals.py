"""Confidence intervals for proportions: the Wilson score interval, shared by evaluations (accuracy)
and head verification (the share of unverified heads that beat a top candidate)."""

import math
import numbers
from statistics import NormalDist

from lensprobe.core.errors import LensprobeError

__all__ = ["wilson_interval"]

_Z95 = 1.959963984540054  # standard normal quantile at 0.975


def _z(confidence: float) -> float:
    """The standard normal quantile of a two-sided ``confidence`` interval (1.96 at 0.95)."""
    if not 0 < confidence < 1:
        raise LensprobeError(f"confidence must be between 0 and 1, got {confidence!r}.")
    if abs(confidence - 0.95) < 1e-12:
        return _Z95

    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(correct: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``correct / n``.

    Returns ``(nan, nan)`` when ``n == 0``.

    Example:
        >>> lo, hi = wilson_interval(8, 10)
        >>> round(lo, 3), round(hi, 3)
        (0.49, 0.943)
    """
    for name, value in (("correct", correct), ("n", n)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise LensprobeError(f"wilson_interval needs whole-number counts, got {name}={value!r}.")
    if n < 0 or correct < 0 or correct > n:
        raise LensprobeError(f"need 0 <= correct <= n, got correct={correct}, n={n}.")
    if n == 0:
        return (math.nan, math.nan)
    z = _z(confidence)
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if correct == 0 else max(0.0, centre - half)  # exact at the ends (no rounding drift)
    hi = 1.0 if correct == n else min(1.0, centre + half)
    return (lo, hi)
