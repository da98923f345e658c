"""The numpy sampler alone (no model): processed logprobs and the truncation knobs."""

from __future__ import annotations

import numpy as np
import pytest

from tapdeck.runner.engine.sampling import (
    Sampler,
    SamplingParams,
    log_softmax,
    top_candidates,
)

LOGITS = np.array([2.0, 1.0, 0.5, -1.0, -3.0])


def _process(**kw) -> np.ndarray:
    return Sampler(SamplingParams(**kw), np.array([], dtype=np.int32), len(LOGITS)).process(LOGITS)


def test_greedy_reports_unscaled_logprobs_and_takes_argmax():
    s = Sampler(SamplingParams(temperature=0.0), np.array([], dtype=np.int32), len(LOGITS))
    token, lp = s.sample(LOGITS)
    assert token == 0
    np.testing.assert_allclose(lp, log_softmax(LOGITS))


def test_temperature_divides_logits_before_softmax():
    np.testing.assert_allclose(_process(temperature=2.0), log_softmax(LOGITS / 2.0))
    lp1, lp2 = _process(temperature=1.0), _process(temperature=2.0)
    assert lp2[0] - lp2[1] == pytest.approx((lp1[0] - lp1[1]) / 2)


def test_top_k_top_p_min_p_mask_and_renormalise():
    lp = _process(top_k=2)
    assert np.isinf(lp[2:]).all() and np.exp(lp[:2]).sum() == pytest.approx(1.0)
    probs = np.exp(log_softmax(LOGITS))
    lp = _process(top_p=0.7)  # the first token holds ~0.6 of the mass, so two tokens are kept
    assert probs[0] < 0.7 and np.isfinite(lp[:2]).all() and np.isinf(lp[2:]).all()
    lp = _process(min_p=0.3)  # keeps tokens with p >= 0.3 * p_max
    assert (np.isfinite(lp) == (probs >= 0.3 * probs.max())).all()
    assert np.exp(lp[np.isfinite(lp)]).sum() == pytest.approx(1.0)


def test_seeded_sampler_is_reproducible_and_follows_the_distribution():
    def draws(seed: int) -> list[int]:
        s = Sampler(SamplingParams(temperature=1.0, seed=seed), np.array([], dtype=np.int32), 5)
        return [s.sample(LOGITS)[0] for _ in range(4000)]

    a = draws(1)
    assert a == draws(1) and a != draws(2)
    freq = np.bincount(a, minlength=5) / len(a)
    np.testing.assert_allclose(freq, np.exp(log_softmax(LOGITS)), atol=0.03)


def test_penalties_lower_seen_tokens():
    s = Sampler(SamplingParams(temperature=0.0, repetition_penalty=3.0), np.array([0], dtype=np.int32), 5)
    lp = s.process(LOGITS)
    assert lp[0] < log_softmax(LOGITS)[0]  # the prompt token is penalised
    assert int(np.argmax(lp)) == 1


def test_top_candidates_best_first():
    assert top_candidates(np.log(np.array([0.1, 0.5, 0.3, 0.1])), 2) == [1, 2]
    assert top_candidates(LOGITS, 0) == []
