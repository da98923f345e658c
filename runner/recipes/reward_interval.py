"""95% intervals for a mean reward and for the change between two evals.

Verifier rewards are mostly 0 or 1: for those the mean is a proportion, and the intervals are
Wilson's score interval and, for a difference of two independent proportions, Newcombe's hybrid of
two Wilson intervals (both keep their coverage at the small n and the rates near 0 an eval of a
small model meets, where the normal approximation gives intervals past 0 or 1). Rewards that are
not all 0 or 1 fall back on the normal approximation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054


def _binary(values: Sequence[float]) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a proportion."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high) of rewards; ValueError for none."""
    n = len(values)
    if not n:
        raise ValueError("no rewards")
    mean = sum(values) / n
    if _binary(values):
        return (mean, *wilson(sum(values), n))
    if n == 1:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, mean - Z95 * sd / math.sqrt(n), mean + Z95 * sd / math.sqrt(n)


def difference_interval(before: Sequence[float], after: Sequence[float]) -> tuple[float, float, float]:
    """(after − before, low, high) for two independent sets of rewards."""
    m0, l0, h0 = mean_interval(before)
    m1, l1, h1 = mean_interval(after)
    delta = m1 - m0
    if _binary(before) and _binary(after):  # Newcombe: each side's Wilson limits
        low = delta - math.sqrt((m1 - l1) ** 2 + (h0 - m0) ** 2)
        high = delta + math.sqrt((h1 - m1) ** 2 + (m0 - l0) ** 2)
        return delta, low, high
    half = math.hypot((h1 - l1) / 2, (h0 - l0) / 2)
    return delta, delta - half, delta + half
