"""The Train screen's sampler–trainer mismatch line, free of Textual: the mean |engine − trainer|
logprob of the sampled tokens per step as bars, so that a step where it jumps stands out, then the
last step's mean, max and share of ratios outside [0.5, 2] (`runner/recipes/logprob_mismatch.py`,
as trackio stores them under `train/`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tapdeck.app.histogram import BARS

MEAN = "train/sampling/sampling_logp_difference/mean"
MAX = "train/sampling/sampling_logp_difference/max"
OUTSIDE = "train/sampling/importance_sampling_ratio/outside_frac"
STEPS = 16
"""The last steps the bars show."""


def step_bars(values: Sequence[float]) -> str:
    """One bar per value, its height relative to the largest (every value at least the lowest bar)."""
    top = max(values, default=0.0)
    if top <= 0:
        return BARS[1] * len(values)
    return "".join(BARS[max(1, round(v / top * 8))] for v in values)


def mismatch_line(points: Mapping[str, Sequence[tuple[int, float]]]) -> str:
    """`sampler≠trainer |Δlogp| ▁▁█▁ mean 0.02 max 0.9 · ratio∉[½,2] 3% (step 4)`, or what is missing."""
    means = sorted(points.get(MEAN) or [])
    if not means:
        return "sampler≠trainer: not logged by this run (cpu-grpo logs it every step)"
    step, mean = means[-1]
    last = {name: dict(points.get(name) or []).get(step) for name in (MAX, OUTSIDE)}
    high = "" if last[MAX] is None else f" max {last[MAX]:.2g}"
    outside = "" if last[OUTSIDE] is None else f" · ratio∉[½,2] {last[OUTSIDE]:.0%}"
    bars = step_bars([v for _, v in means[-STEPS:]])
    return f"sampler≠trainer |Δlogp| {bars} mean {mean:.2g}{high}{outside} (step {step})"
