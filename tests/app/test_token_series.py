"""A turn's per-token sparkline series: logprobs as reported, entropy over the captured alternatives."""

from __future__ import annotations

import math

from tapdeck.app.token_series import entropy_series, logprob_series
from tapdeck.schema.sessions import TurnDetail


def _turn(logprobs, tops) -> TurnDetail:
    fields = {name: None for name, info in TurnDetail.model_fields.items() if info.is_required()}
    return TurnDetail.model_construct(**{**fields, "logprobs": logprobs, "top_logprobs": tops})


def test_a_masked_token_shows_as_no_surprise() -> None:
    assert logprob_series(_turn([-0.5, None, -2.0], None)) == [-0.5, 0.0, -2.0]


def test_entropy_is_over_the_captured_alternatives_and_absent_without_them() -> None:
    half = math.log(0.5)
    series = entropy_series(_turn([half], [[("a", half), ("b", half)]]))
    assert math.isclose(series[0], math.log(2))
    assert entropy_series(_turn([-0.1], None)) == [] and entropy_series(_turn([-0.1], [[]])) == []
