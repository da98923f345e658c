"""Token-in planning against the recorded vLLM server: which calls fall back to text, and why.

The recorded server answers only what vLLM 0.32 answered when recorded (chat completions,
models); its `/tokenize` and token-id completions are absent here, so these tests pin the
fallbacks. The token-in path itself is tested on the embedded engine
(tests/engine/test_token_in_capture.py) and on the recorded break cases (tests/proxy_core).
"""

from __future__ import annotations

import copy

import pytest

from tapdeck.proxy.engine_client import EngineClient
from tapdeck.proxy.graph import RolloutGraph
from tapdeck.proxy.tiers import EngineSpec
from tapdeck.proxy.token_in import Plan, TokenIn
from tests.conftest import vllm_fixture as recorded
from tests.proxy_core.proxy_core_fixtures import turn_from_fixture

SPEC = EngineSpec(url="http://vllm.test/v1", model="smollm2")


def _held_graph() -> RolloutGraph:
    g = RolloutGraph()
    g.add(turn_from_fixture("chat_multiturn_1", 0))
    return g


def _next_call(name: str = "chat_multiturn_2") -> tuple[dict, dict]:
    """The harness's request and the upstream body the proxy prepared for it."""
    request = {"messages": copy.deepcopy(recorded(name)["request"]["messages"]), "max_tokens": 32}
    upstream, _ = EngineClient(SPEC).prepare(request, "tokens", "smollm2", True)
    return request, upstream


async def test_engine_without_tokenize_falls_back_once_and_stays_text(upstream):
    client = EngineClient(SPEC, http=upstream.client())
    token_in = TokenIn(client)
    request, body = _next_call()
    plan = await token_in.plan(_held_graph(), request, body)
    assert (plan.prompt_ids, plan.record["mode"], plan.record["reason"]) == \
        (None, "text", "engine_unsupported")
    asked = len(upstream.requests)
    again = await token_in.plan(_held_graph(), request, body)
    assert again.record["reason"] == "engine_unsupported" and len(upstream.requests) == asked
    assert str(upstream.requests[0].url) == "http://vllm.test/tokenize"


@pytest.mark.parametrize(("change", "reason"), [
    (lambda req, body: body.update(tools=[{"type": "function", "function": {"name": "sh"}}]), "tools"),
    (lambda req, body: req["messages"][2].update(content="an edited reply"), "not_held"),
    (lambda req, body: req["messages"].__setitem__(0, {"role": "system", "content": "other"}),
     "not_held"),
])
async def test_calls_that_extend_no_held_reply_take_text_without_asking_the_engine(upstream, change,
                                                                                  reason):
    token_in = TokenIn(EngineClient(SPEC, http=upstream.client()))
    request, body = _next_call()
    change(request, body)
    plan = await token_in.plan(_held_graph(), request, body)
    assert plan.record == {"mode": "text", "reason": reason} and not upstream.requests


async def test_engine_refusing_token_prompts_gets_the_call_as_text(upstream):
    token_in = TokenIn(EngineClient(SPEC, http=upstream.client()))
    _, body = _next_call()
    reply, plan = await token_in.send(body, Plan([1, 2, 3], {"mode": "ids", "extends": 0}))
    assert plan.record["mode"] == "text" and plan.record["reason"] == "engine_refused_ids"
    assert reply["choices"][0]["message"]["content"] == \
        recorded("chat_basic")["response"]["choices"][0]["message"]["content"]
    assert [r.url.path for r in upstream.requests] == ["/v1/completions", "/v1/chat/completions"]
    assert token_in.unsupported
