"""The probe and the engine client against the real embedded engine (SmolLM2-135M over HTTP)."""

from __future__ import annotations

import pytest

from tapdeck.proxy.upstream import tiers
from tapdeck.proxy.upstream.client import EngineClient, EngineError
from tapdeck.proxy.upstream.tiers import EngineSpec, Tier, probe

pytestmark = pytest.mark.slow


async def test_embedded_engine_probes_as_tokens_with_processed_logprobs(embedded_engine):
    spec = EngineSpec(url=embedded_engine.base_url)
    tiers.PROBES.forget(spec)
    client = EngineClient(spec)
    try:
        result = await probe(spec, client)
        assert result.tier is Tier.TOKENS, result.detail
        assert result.served_model == embedded_engine.served_name
        assert result.logprobs_mode == "processed", result.detail
        assert result.findings == []
        assert client.max_model_len == result.max_model_len and result.max_model_len

        chat = {
            "model": "whatever-the-harness-says",
            "stream": True,
            "stream_options": {"include_usage": True},
            "tools": [],
            "tool_choice": "auto",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Say hi."},
            ],
            "max_tokens": 6,
            "temperature": 1.0,
            "top_p": 0.5,
            "seed": 3,
        }
        body, sampling = client.prepare(chat, result.tier, result.served_model, training=True)
        reply = await client.complete(body)
        cap = EngineClient.parse_capture(reply)
        assert cap.findings == []
        assert cap.prompt_ids.size == reply["usage"]["prompt_tokens"]
        assert cap.sampled_ids.size == cap.logprobs.size == len(cap.token_texts) > 0
        assert (cap.logprobs <= 0).all()
        assert sampling["requested"]["top_p"] == 0.5 and sampling["submitted"]["top_p"] == 1.0

        with pytest.raises(EngineError) as err:
            await client.complete({**body, "model": "no-such-model"})
        assert err.value.status == 502 and embedded_engine.base_url in err.value.message
    finally:
        await client.aclose()
        tiers.PROBES.forget(spec)
