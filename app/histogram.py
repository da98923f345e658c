"""Reward histograms as one line of bar characters, free of Textual (they sit in table cells and
header lines, where a widget cannot go; the same eight heights Textual's Sparkline draws with)."""

from __future__ import annotations

import math
from collections.abc import Iterable

BARS = " ▁▂▃▄▅▆▇█"
"""Index 0 is an empty bin; 1-8 scale up to the fullest bin."""


def histogram(values: Iterable[object], bins: int = 10, lo: float = 0.0, hi: float = 1.0) -> list[int]:
    """Counts of the graded values in `bins` equal bins over [lo, hi] (widened to hold every value);
    None (never graded) and non-numbers are left out, never counted as 0."""
    graded = [
        float(v)
        for v in values
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ]
    if not graded:
        return [0] * bins
    lo, hi = min(lo, *graded), max(hi, *graded)
    width = (hi - lo) / bins or 1.0
    counts = [0] * bins
    for value in graded:
        counts[min(bins - 1, int((value - lo) / width))] += 1
    return counts


def bars(counts: list[int]) -> str:
    """One character per bin, its height relative to the fullest bin (a filled bin is never blank)."""
    top = max(counts, default=0)
    if top == 0:
        return BARS[0] * len(counts)
    return "".join(BARS[0] if c == 0 else BARS[max(1, round(c / top * 8))] for c in counts)


def reward_line(values: Iterable[object], bins: int = 10) -> str:
    """`▁  █ 0–1 · 6 graded`: the histogram with its range and how many values it holds."""
    values = list(values)
    counts = histogram(values, bins)
    graded = sum(counts)
    if not graded:
        return "no graded rewards yet"
    numbers = [
        float(v)
        for v in values
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ]
    lo, hi = min(0.0, *numbers), max(1.0, *numbers)
    return f"{bars(counts)} {lo:g}–{hi:g} · {graded} graded"
