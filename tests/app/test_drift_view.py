"""app/views/drift.py: the colour scale by |Δ|, a token's two logprobs, the figures' line, and the
run histogram's buckets and rows."""

from __future__ import annotations

import math

import pytest

from tapdeck.app.views.drift import (
    BUCKET_EDGES,
    LN2,
    delta_buckets,
    deltas_line,
    drift_detail,
    drift_tone,
    figures_line,
    histogram_rows,
    token_deltas,
)
from tapdeck.runner.recipes.logprob_mismatch import MAX, MEAN, OUTSIDE
from tapdeck.runner.replay.drift import K3_KL
from tapdeck.schema.replay import DriftFigures, ReplayTurnLogprobs


def test_the_tone_follows_the_size_of_delta_either_way_and_ln2_is_where_the_ratio_leaves_its_band():
    assert [drift_tone(d, False) for d in (0.0, -0.049, 0.05, -0.29, 0.3, -0.69, LN2, -LN2, 5.0)] == [
        "same",
        "same",
        "small",
        "small",
        "mid",
        "mid",
        "outside",
        "outside",
        "outside",
    ]
    assert math.exp(LN2) == pytest.approx(2.0)


def test_a_token_without_delta_is_unscored_and_masked_wins():
    assert drift_tone(None, False) == "unscored"
    assert drift_tone(None, True) == drift_tone(3.0, True) == "masked"


def test_deltas_are_reference_minus_sampler_and_none_where_an_engine_gave_none():
    pair = ReplayTurnLogprobs(seq=0, sampler=[-1.0, -0.5, None], reference=[-0.75, None, -2.0])
    assert token_deltas(pair) == [0.25, None, None]
    assert token_deltas(None) == []


def test_the_token_detail_shows_both_logprobs_delta_and_ratio():
    pair = ReplayTurnLogprobs(seq=0, sampler=[-1.0, -0.5], reference=[-1.5, None])
    assert drift_detail(pair, 0) == "sampler -1.000 · reference -1.500 · Δ -0.500 (ratio 0.61)"
    assert drift_detail(pair, 1) == "sampler -0.500 · reference ? · no Δ: an engine gave no logprob"
    assert drift_detail(pair, 2) == drift_detail(None, 0) == "not scored by the replay"


def test_the_figures_line_names_each_figure():
    figures = DriftFigures(
        tokens=72, metrics={MEAN: 0.0123, MAX: 0.5, OUTSIDE: 0.0139, K3_KL: 0.00012}, largest=[]
    )
    assert figures_line(figures) == (
        "mean |Δ| 0.012 · max 0.500 · k3 KL 0.00012 · 1.4% outside [0.5, 2] · 72 tok"
    )
    assert figures_line(None) == "no turn could be scored"


def test_buckets_hold_each_scored_delta_by_size_and_leave_none_out():
    deltas = [0.0, -0.005, 0.01, 0.02, -0.05, 0.2, -0.5, LN2, 1.0, -1.5, 9.0, None, math.nan]
    buckets = delta_buckets(deltas)
    assert [b.low for b in buckets] == list(BUCKET_EDGES)
    assert [b.high for b in buckets] == [*BUCKET_EDGES[1:], None]
    assert [b.count for b in buckets] == [2, 2, 1, 1, 1, 2, 2]


def test_histogram_rows_scale_to_the_fullest_bucket_and_fit_80_columns():
    buckets = delta_buckets([0.001] * 80 + [0.05] * 20 + [2.0])
    rows = histogram_rows(buckets, width=36)
    assert all(len(r) <= 76 for r in rows)
    assert rows[0].startswith("0.00–0.01  " + "█" * 36) and rows[0].endswith("80  79.2%")
    assert rows[2].split()[1] == "█" * 9  # 20/80 of 36 cells
    assert rows[1].split()[1:] == ["0", "0.0%"]  # an empty bucket draws no bar
    assert rows[-1].startswith("≥ 1.50     ▌ ")  # 1/80 of 36 cells: half a cell
    lone = histogram_rows(delta_buckets([0.001] * 1000 + [2.0]), width=36)[-1]
    assert lone.startswith("≥ 1.50     ▏ ")  # under an eighth of a cell: drawn, never blank


def test_deltas_line_sums_the_scored_tokens():
    assert (
        deltas_line([0.1, -0.3, None, 1.0]) == "3 tok · mean |Δ| 0.467 · max 1.000 · 33.3% outside [0.5, 2]"
    )
    assert deltas_line([None]) == "no scored tokens"
