"""Reward histograms: bins over [0, 1] widened to the values, ungraded rewards left out."""

from __future__ import annotations

from tapdeck.app.histogram import bars, histogram, reward_line


def test_rewards_fall_in_their_bins_and_ungraded_ones_are_not_zero() -> None:
    assert histogram([0.0, 0.0, 1.0, None, 0.55], bins=4) == [2, 0, 1, 1]
    assert histogram([None, None], bins=3) == [0, 0, 0]


def test_a_reward_outside_zero_to_one_widens_the_range() -> None:
    assert histogram([-1.0, 1.0], bins=2) == [1, 1]
    assert reward_line([-1.0, 1.0], bins=2) == "██ -1–1 · 2 graded"


def test_bars_scale_to_the_fullest_bin_and_never_blank_a_filled_one() -> None:
    assert bars([8, 0, 1, 4]) == "█ ▁▄"
    assert bars([100, 1]) == "█▁"
    assert reward_line([None]) == "no graded rewards yet"
