"""Sampling and logprobs: processed logprobs (of the distribution actually sampled), greedy
determinism, seeded reproducibility, truncation knobs, stop conditions."""

from __future__ import annotations

import math

import httpx
import pytest

from tests.support.vllm_recordings import vllm_fixture

pytestmark = pytest.mark.slow

BASE = vllm_fixture("chat_basic")["request"]


def _chat(engine, **overrides) -> dict:
    body = dict(BASE, **overrides)
    r = httpx.post(f"{engine.base_url}/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _tops(entry: dict) -> dict[str, float]:
    return {t["token"]: t["logprob"] for t in entry["top_logprobs"]}


def test_processed_logprobs_scale_with_inverse_temperature(embedded_engine):
    # Position 0 has the same context at every temperature: compare two tokens by name.
    req = vllm_fixture("probe_processed_t1")["request"]
    at = {}
    for t in (0.0, 1.0, 2.0):
        body = _chat(
            embedded_engine, messages=req["messages"], temperature=t, seed=9, max_tokens=2, top_logprobs=5
        )
        at[t] = body["choices"][0]["logprobs"]["content"][0]
    ranked = sorted(_tops(at[1.0]).items(), key=lambda kv: -kv[1])
    (a, la1), (b, lb1) = ranked[0], ranked[1]
    t2 = _tops(at[2.0])
    assert a in t2 and b in t2
    assert t2[a] - t2[b] == pytest.approx((la1 - lb1) / 2, abs=1e-9)
    # Greedy reports the unscaled (T=1) distribution, as vLLM's processed mode does.
    assert _tops(at[0.0])[a] == pytest.approx(la1, abs=1e-6)
    assert _tops(at[0.0])[b] == pytest.approx(lb1, abs=1e-6)
    # The T=2 values are not the raw (T=1) ones, as a raw_logprobs server would report.
    assert not math.isclose(t2[a], la1, abs_tol=1e-6)


def test_sampled_logprob_is_the_first_top_entry_and_consistent(embedded_engine):
    body = _chat(embedded_engine, temperature=1.0, seed=3, max_tokens=6, top_logprobs=20)
    entries = body["choices"][0]["logprobs"]["content"]
    assert len(entries) == len(body["choices"][0]["token_ids"]) == 6  # this seed runs to max_tokens
    for entry in entries:
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]
        total = sum(math.exp(t["logprob"]) for t in entry["top_logprobs"])
        assert total <= 1.0 + 1e-9
        assert entry["logprob"] <= 0.0


def test_top_k_renormalises_over_the_kept_tokens(embedded_engine):
    body = _chat(embedded_engine, temperature=1.0, seed=5, top_k=2, max_tokens=8, top_logprobs=3)
    entries = body["choices"][0]["logprobs"]["content"]
    assert len(entries) == len(body["choices"][0]["token_ids"]) == 8
    for entry in entries:
        finite = [t["logprob"] for t in entry["top_logprobs"] if t["logprob"] > -9999.0]
        assert len(finite) <= 2
        assert math.log(sum(math.exp(x) for x in finite)) == pytest.approx(0.0, abs=1e-9)
        # masked tokens are reported clamped, as vLLM does
        assert all(t["logprob"] == -9999.0 for t in entry["top_logprobs"] if t["logprob"] <= -9999.0)


def test_top_p_and_min_p_keep_mass_on_the_kept_tokens(embedded_engine):
    for knobs in ({"top_p": 0.5}, {"min_p": 0.2}):
        body = _chat(embedded_engine, temperature=1.0, seed=2, max_tokens=6, top_logprobs=20, **knobs)
        entries = body["choices"][0]["logprobs"]["content"]
        assert len(entries) == len(body["choices"][0]["token_ids"]) == 6, knobs
        for entry in entries:
            kept = [t["logprob"] for t in entry["top_logprobs"] if t["logprob"] > -9999.0]
            assert sum(math.exp(x) for x in kept) == pytest.approx(1.0, abs=1e-9), knobs


def test_greedy_is_deterministic(embedded_engine):
    a = _chat(embedded_engine, max_tokens=10, top_logprobs=2)
    b = _chat(embedded_engine, max_tokens=10, top_logprobs=2)
    ca, cb = a["choices"][0], b["choices"][0]
    assert ca["token_ids"] == cb["token_ids"]
    assert [e["logprob"] for e in ca["logprobs"]["content"]] == pytest.approx(
        [e["logprob"] for e in cb["logprobs"]["content"]], abs=1e-4
    )


def test_seeded_sampling_is_reproducible_and_seed_dependent(embedded_engine):
    runs = {
        seed: _chat(embedded_engine, temperature=1.2, seed=seed, max_tokens=12)["choices"][0]["token_ids"]
        for seed in (11, 12, 13)
    }
    again = _chat(embedded_engine, temperature=1.2, seed=11, max_tokens=12)["choices"][0]
    assert again["token_ids"] == runs[11]
    assert len({tuple(v) for v in runs.values()}) > 1


def test_n2_gives_two_choices_reproducibly(embedded_engine):
    req = vllm_fixture("chat_n2")["request"]
    a = _chat(embedded_engine, **req)
    b = _chat(embedded_engine, **req)
    assert [c["index"] for c in a["choices"]] == [0, 1]
    assert [c["token_ids"] for c in a["choices"]] == [c["token_ids"] for c in b["choices"]]
    assert a["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in a["choices"])


def test_stop_string_cuts_text_and_reports_stop_reason(embedded_engine):
    body = _chat(embedded_engine, stop=["Paris"])
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == "Paris"
    assert choice["message"]["content"] == "The capital of France is "
    assert choice["token_ids"][-1] == 7042  # " Paris": the token that completed the stop string
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])


def test_stop_token_ids_and_max_completion_tokens(embedded_engine):
    body = _chat(embedded_engine, stop_token_ids=[4649])  # " France"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == 4649
    assert choice["token_ids"][-1] == 4649
    body = _chat(embedded_engine, max_tokens=None, max_completion_tokens=3)
    assert len(body["choices"][0]["token_ids"]) == 3
    assert body["choices"][0]["finish_reason"] == "length"
