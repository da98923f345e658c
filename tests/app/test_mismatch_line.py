"""The Train screen's sampler–trainer mismatch line: a step where the mismatch jumps stands out."""

from __future__ import annotations

from tapdeck.app.mismatch_line import MAX, MEAN, OUTSIDE, STEPS, mismatch_line, step_bars


def test_a_step_where_the_mismatch_jumps_stands_out() -> None:
    points = {
        # Arrival order need not be step order.
        MEAN: [(2, 0.0001), (1, 0.0001), (3, 0.4), (4, 0.0002)],
        MAX: [(1, 0.001), (2, 0.001), (3, 2.5), (4, 0.002)],
        OUTSIDE: [(1, 0.0), (2, 0.0), (3, 0.125), (4, 0.0)],
    }
    assert mismatch_line(points) == (
        "sampler≠trainer |Δlogp| ▁▁█▁ mean 0.0002 max 0.002 · ratio∉[½,2] 0% (step 4)"
    )
    points = {name: [p for p in values if p[0] <= 3] for name, values in points.items()}
    assert mismatch_line(points) == "sampler≠trainer |Δlogp| ▁▁█ mean 0.4 max 2.5 · ratio∉[½,2] 12% (step 3)"


def test_the_bars_keep_the_last_steps_and_a_flat_series_stays_low() -> None:
    many = {MEAN: [(s, 0.01 * s) for s in range(1, 41)]}
    bars = mismatch_line(many).split()[2]
    assert len(bars) == STEPS and bars[-1] == "█"
    assert step_bars([0.0, 0.0]) == "▁▁" and step_bars([0.3, 0.3]) == "██"


def test_a_run_that_logs_no_mismatch_says_so() -> None:
    assert mismatch_line({}) == "sampler≠trainer: not logged by this run (cpu-grpo logs it every step)"
    assert mismatch_line({MEAN: [(1, 0.01)]}) == "sampler≠trainer |Δlogp| █ mean 0.01 (step 1)"
