"""capture-cases E33-E35: tier probe and the temperature-ratio probe, on recorded vLLM bodies."""

from __future__ import annotations

import asyncio
import copy
import socket

import httpx
import pytest

from tapdeck.proxy.upstream import tiers
from tapdeck.proxy.upstream.client import EngineClient
from tapdeck.proxy.upstream.tiers import EngineSpec, Tier, classify_logprobs_mode, probe
from tapdeck.schema.findings import Level

URL = "http://vllm.test:8111/v1"


@pytest.fixture(autouse=True)
def fresh_cache():
    tiers.PROBES.forget()
    yield
    tiers.PROBES.forget()


def first_entry(rec: dict) -> dict:
    return rec["response"]["choices"][0]["logprobs"]["content"][0]


def probe_replies(vllm, kind: str = "raw", *, strip: tuple[str, ...] = ()):
    """Capture call → chat_basic; T=1/T=2 calls → the recorded probe files (raw or processed)."""
    prefix = "probe_" if kind == "raw" else "probe_processed_"

    def reply(body: dict) -> tuple[int, dict]:
        if body.get("top_logprobs", 0) > 0:
            name = f"{prefix}t1" if body["temperature"] == 1.0 else f"{prefix}t2"
        else:
            name = "chat_basic"
        out = vllm(name)["response"]
        for key in strip:
            if key == "logprobs":
                out["choices"][0]["logprobs"] = None
            else:
                out.pop(key, None)
                out["choices"][0].pop(key, None)
        return 200, out

    return reply


def test_ratio_reads_recorded_raw_probes_as_raw(vllm):
    t1, t2 = first_entry(vllm("probe_t1")), first_entry(vllm("probe_t2"))
    # The recorded probes ran with top_logprobs 2, so their only shared pair is 0.25 apart
    # (bf16 step): below the live probe's guard, so it is read with the guard lowered.
    assert classify_logprobs_mode(t1, t2)[0] == "unknown"
    mode, detail = classify_logprobs_mode(t1, t2, min_gap=0.2)
    assert mode == "raw" and "'One'-'The'" in detail


def test_ratio_reads_recorded_processed_probes_as_processed(vllm):
    t1, t2 = first_entry(vllm("probe_processed_t1")), first_entry(vllm("probe_processed_t2"))
    assert classify_logprobs_mode(t1, t2, min_gap=0.2)[0] == "processed"


def test_ratio_compares_tokens_by_name_not_position(vllm):
    # Position 1 of the raw T=2 probe lists the sampled " user" first, " prime" second: by position
    # the "gap" would be negative; by name the T=1 runner-up " of" is absent → unknown, not a guess.
    t1 = vllm("probe_t1")["response"]["choices"][0]["logprobs"]["content"][1]
    t2 = vllm("probe_t2")["response"]["choices"][0]["logprobs"]["content"][1]
    mode, detail = classify_logprobs_mode(t1, t2)
    assert mode == "unknown" and "no usable runner-up" in detail


def test_ratio_unknown_for_sentinel_runner_up(vllm):
    t1 = first_entry(vllm("probe_t1"))
    t1 = copy.deepcopy(t1)
    t1["top_logprobs"][1]["logprob"] = -9999.0
    assert classify_logprobs_mode(t1, t1)[0] == "unknown"


def test_ratio_unknown_when_far_from_half_and_one(vllm):
    t1, t2 = copy.deepcopy(first_entry(vllm("probe_processed_t1"))), first_entry(vllm("probe_processed_t2"))
    t2 = copy.deepcopy(t2)
    t2["top_logprobs"][1]["logprob"] = t2["top_logprobs"][0]["logprob"] - 0.25 * 0.75
    assert classify_logprobs_mode(t1, t2, min_gap=0.2)[0] == "unknown"


async def test_probe_full_vllm_is_tokens_tier_with_served_name(make_inprocess_vllm, vllm, monkeypatch):
    monkeypatch.setattr(tiers, "MIN_T1_GAP", 0.2)
    up = make_inprocess_vllm(answer=probe_replies(vllm, "processed"))
    result = await probe(EngineSpec(url=URL), up.client())
    assert result.tier is Tier.TOKENS
    assert result.served_model == "smollm2" and result.max_model_len == 2048
    assert result.logprobs_mode == "processed" and result.findings == []
    capture, t1, t2 = up.requests
    assert capture["return_token_ids"] is True and capture["model"] == "smollm2"
    assert (t1["temperature"], t2["temperature"]) == (1.0, 2.0)
    assert t1["top_logprobs"] == t2["top_logprobs"] == 5 and t1["max_tokens"] == 1
    assert result.alternatives == 2  # what the recorded replies carry: calls will ask for 2


async def test_probe_engine_refusing_alternatives_keeps_tokens_and_asks_for_none(
    make_inprocess_vllm, vllm, vllm_error
):
    status, error = vllm_error("top_logprobs_too_large")
    good = probe_replies(vllm, "processed")
    up = make_inprocess_vllm(answer=lambda body: (status, error) if body.get("top_logprobs") else good(body))
    result = await probe(EngineSpec(url=URL), up.client())
    assert result.tier is Tier.TOKENS and result.logprobs_mode == "unknown"
    assert result.alternatives == 0


async def test_probe_raw_logprobs_demotes_with_fatal(make_inprocess_vllm, vllm, monkeypatch):
    monkeypatch.setattr(tiers, "MIN_T1_GAP", 0.2)
    up = make_inprocess_vllm(answer=probe_replies(vllm, "raw"))
    result = await probe(EngineSpec(url=URL), up.client())
    assert result.tier is Tier.LOGPROBS and result.measured_tier is Tier.TOKENS
    assert result.logprobs_mode == "raw"
    assert [(f.level, f.code) for f in result.findings] == [(Level.FATAL, "raw_logprobs")]
    # the operator's override keeps tokens, from the same cached probe (no new engine calls)
    calls = len(up.sent)
    allowed = await probe(EngineSpec(url=URL), up.client(), allow_raw_logprobs=True)
    assert allowed.tier is Tier.TOKENS and len(up.sent) == calls
    assert [f.level for f in allowed.findings] == [Level.WARN]


async def test_probe_unknown_mode_keeps_tokens_with_warning(make_inprocess_vllm, vllm):
    up = make_inprocess_vllm(answer=probe_replies(vllm, "raw"))  # 0.25 gap < guard → unknown
    result = await probe(EngineSpec(url=URL), up.client())
    assert result.tier is Tier.TOKENS and result.logprobs_mode == "unknown"
    assert [f.code for f in result.findings] == ["logprobs_mode_unknown"]


async def test_probe_logprobs_without_ids_is_logprobs_tier(make_inprocess_vllm, vllm):
    up = make_inprocess_vllm(answer=probe_replies(vllm, "processed", strip=("prompt_token_ids", "token_ids")))
    result = await probe(EngineSpec(url=URL), up.client())
    assert result.tier is Tier.LOGPROBS


async def test_probe_neither_is_text_tier(make_inprocess_vllm, vllm):
    up = make_inprocess_vllm(
        answer=probe_replies(vllm, "processed", strip=("prompt_token_ids", "token_ids", "logprobs"))
    )
    result = await probe(EngineSpec(url=URL), up.client())
    assert result.tier is Tier.TEXT and "no per-token logprobs" in result.detail


async def test_probe_ambiguous_models_is_text(make_inprocess_vllm, vllm):
    listing = vllm("models")["models"]["response"]
    second = {**listing["data"][0], "id": "other"}
    up = make_inprocess_vllm(listing={**listing, "data": [*listing["data"], second]})
    result = await probe(EngineSpec(url=URL), up.client())
    assert result.tier is Tier.TEXT and "smollm2, other" in result.detail
    assert up.requests == []  # no capture call to a guessed model
    named = await probe(EngineSpec(url=URL, model="smollm2"), up.client())
    assert named.served_model == "smollm2" and named.tier is not Tier.TEXT


async def test_probe_failing_capture_call_is_text(make_inprocess_vllm, vllm_error):
    status, body = vllm_error("top_logprobs_too_large")
    up = make_inprocess_vllm(answer=lambda _b: (status, body))
    result = await probe(EngineSpec(url=URL), up.client())
    assert result.tier is Tier.TEXT and "capture call failed" in result.detail


async def test_probe_html_page_is_text(make_inprocess_vllm):
    up = make_inprocess_vllm(answer=lambda _b: (200, "<html>tunnel gone</html>"))
    result = await probe(EngineSpec(url=URL), up.client())
    assert result.tier is Tier.TEXT


async def test_probe_unreachable_is_text_and_not_cached():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = EngineSpec(url=f"http://127.0.0.1:{port}/v1")
    result = await probe(spec)
    assert result.tier is Tier.TEXT and spec.url in result.detail
    assert not result.cacheable and spec.cache_key() not in tiers.PROBES._done


async def test_concurrent_first_probes_share_one(make_inprocess_vllm, vllm):
    up = make_inprocess_vllm(answer=probe_replies(vllm, "processed"))
    http = up.client()
    spec = EngineSpec(url=URL, api_key="k1")
    results = await asyncio.gather(*(probe(spec, http) for _ in range(8)))
    assert len({r.tier for r in results}) == 1
    models_calls = [r for r in up.sent if r.method == "GET"]
    assert len(models_calls) == 1 and len(up.requests) == 3
    await probe(spec, http)
    assert len(up.requests) == 3  # cached
    await probe(EngineSpec(url=URL, api_key="k2"), http)  # another key → its own probe
    assert len(up.requests) == 6


async def test_probe_accepts_engine_client_and_sets_max_model_len(make_inprocess_vllm, vllm):
    up = make_inprocess_vllm(answer=probe_replies(vllm, "processed"))
    client = EngineClient(EngineSpec(url=URL), http=up.client())
    await probe(client.spec, client)
    assert client.max_model_len == 2048 and client.cap == 2048


async def test_server_refusing_return_token_ids_is_logprobs_tier(make_inprocess_vllm, vllm):
    # An OpenAI-compatible server that rejects the unknown field but returns logprobs.
    inner = probe_replies(vllm, "processed", strip=("prompt_token_ids", "token_ids"))

    def reply(body: dict) -> tuple[int, dict]:
        if "return_token_ids" in body:
            return 400, {
                "error": {
                    "message": "Unrecognized request argument supplied: return_token_ids",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            }
        return inner(body)

    result = await probe(EngineSpec(url=URL), make_inprocess_vllm(answer=reply).client())
    assert result.tier is Tier.LOGPROBS and result.served_model == "smollm2"


async def test_named_model_probed_without_models_route(make_inprocess_vllm, vllm):
    up = make_inprocess_vllm(answer=probe_replies(vllm, "processed"), listing=None)
    assert (await probe(EngineSpec(url=URL), up.client())).tier is Tier.TEXT
    result = await probe(EngineSpec(url=URL, model="smollm2"), up.client())
    assert result.tier is Tier.TOKENS and result.max_model_len is None


async def test_probe_never_raises_on_a_broken_client():
    http = httpx.AsyncClient()
    await http.aclose()
    result = await probe(EngineSpec(url=URL), http)
    assert result.tier is Tier.TEXT and not result.cacheable
