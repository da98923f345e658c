"""The per-step sampler–trainer mismatch metrics, against a case worked by hand."""

from __future__ import annotations

import math

import pytest

from tapdeck.runner.recipes.logprob_mismatch import MAX, MEAN, OUTSIDE, mismatch_metrics


def test_mismatch_metrics_of_a_hand_worked_step() -> None:
    # trainer − engine per token: 0 (ratio 1), −0.5 (0.61), +1 (2.72: outside), −1 (0.37: outside);
    # the fifth has no engine logprob (NaN) and is left out.
    trainer = [-1.0, -2.0, -0.5, -3.0, -0.1]
    engine = [-1.0, -1.5, -1.5, -2.0, math.nan]
    assert mismatch_metrics(trainer, engine) == {
        MEAN: pytest.approx((0 + 0.5 + 1 + 1) / 4),
        MAX: pytest.approx(1.0),
        OUTSIDE: 2 / 4,
    }


def test_names_are_trls_and_the_range_is_closed() -> None:
    assert (MEAN, MAX) == ("sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max")
    # A ratio of exactly 2 or 0.5 is inside; a hair beyond is out.
    assert mismatch_metrics([math.log(2), 0.0], [0.0, math.log(2)])[OUTSIDE] == 0.0
    assert mismatch_metrics([math.log(2.001), 0.0], [0.0, math.log(2.001)])[OUTSIDE] == 1.0


def test_no_pair_left_gives_no_metric_and_unequal_lengths_are_refused() -> None:
    assert mismatch_metrics([], []) == {}
    assert mismatch_metrics([-1.0], [math.nan]) == {}
    with pytest.raises(ValueError, match="2 trainer logprobs against 1 engine"):
        mismatch_metrics([-1.0, -2.0], [-1.0])
