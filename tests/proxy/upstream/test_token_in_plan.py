"""Token-in planning against the recorded vLLM server: which calls fall back to text, and why.

The recorded server here answers chat completions and models only, so these tests pin the
fallbacks, including calls with tools when the engine's tool-call parser is unknown or a call is
forced, and every call on an engine running a reasoning parser. The token-in path itself is tested
against recorded vLLM `/tokenize` and token-id completions (test_token_in_recorded.py), on the
embedded engine (tests/runner/engine/test_token_in_capture.py, test_token_in_tools.py) and on the
recorded break cases (test_token_in.py).
"""

from __future__ import annotations

import copy

import pytest

from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.upstream.client import EngineClient
from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.proxy.upstream.token_in import Plan, TokenIn
from tests.support.recorded_turns import turn_from_fixture
from tests.support.vllm_recordings import smollm2_markers
from tests.support.vllm_recordings import vllm_fixture as recorded

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


async def test_engine_without_tokenize_falls_back_once_and_stays_text(inprocess_vllm):
    client = EngineClient(SPEC, http=inprocess_vllm.client())
    token_in = TokenIn(client)
    request, body = _next_call()
    plan = await token_in.plan(_held_graph(), request, body)
    assert (plan.prompt_ids, plan.record["mode"], plan.record["reason"]) == (
        None,
        "text",
        "engine_unsupported",
    )
    asked = len(inprocess_vllm.sent)
    again = await token_in.plan(_held_graph(), request, body)
    assert again.record["reason"] == "engine_unsupported" and len(inprocess_vllm.sent) == asked
    assert inprocess_vllm.sent[0].url == "http://vllm.test/tokenize"


SH = [{"type": "function", "function": {"name": "sh"}}]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda req, body: body.update(tools=SH), "tool_parser_unknown"),
        (lambda req, body: body.update(tools=SH, tool_choice="required"), "tool_choice_forced"),
        (
            lambda req, body: body.update(
                tools=SH, tool_choice={"type": "function", "function": {"name": "sh"}}
            ),
            "tool_choice_forced",
        ),
        (lambda req, body: body.update(functions=[{"name": "sh"}]), "functions"),
        (lambda req, body: req["messages"][2].update(content="an edited reply"), "not_held"),
        (
            lambda req, body: req["messages"].__setitem__(0, {"role": "system", "content": "other"}),
            "not_held",
        ),
    ],
)
async def test_calls_that_extend_no_held_reply_take_text_without_asking_the_engine(
    inprocess_vllm, change, reason
):
    token_in = TokenIn(EngineClient(SPEC, http=inprocess_vllm.client()), marker_cache=smollm2_markers())
    request, body = _next_call()
    change(request, body)
    plan = await token_in.plan(_held_graph(), request, body)
    assert plan.prompt_ids is None and not inprocess_vllm.sent
    assert (plan.record["mode"], plan.record["reason"]) == ("text", reason)


async def test_unknown_tool_parser_is_named_in_the_fallback(inprocess_vllm):
    token_in = TokenIn(
        EngineClient(SPEC, http=inprocess_vllm.client()),
        tool_parser="mistral",
        marker_cache=smollm2_markers(),
    )
    request, body = _next_call()
    body["tools"] = SH
    plan = await token_in.plan(_held_graph(), request, body)
    assert plan.record["reason"] == "tool_parser_unknown"
    assert "'mistral'" in plan.record["detail"] and "hermes" in plan.record["detail"]
    assert not inprocess_vllm.sent


async def test_engine_with_a_reasoning_parser_sends_every_call_as_text(inprocess_vllm):
    """Its chat route splits the reasoning out of the reply and the completions route does not:
    a continued call would hand the harness the reasoning as content."""
    token_in = TokenIn(
        EngineClient(SPEC, http=inprocess_vllm.client()), tool_parser="hermes", reasoning_parser="deepseek_r1"
    )
    request, body = _next_call()
    plan = await token_in.plan(_held_graph(), request, body)
    assert (plan.record["reason"], plan.prompt_ids) == ("reasoning_parser", None)
    assert "deepseek_r1" in plan.record["detail"] and not inprocess_vllm.sent


async def test_engine_refusing_token_prompts_gets_the_call_as_text(inprocess_vllm):
    token_in = TokenIn(EngineClient(SPEC, http=inprocess_vllm.client()))
    _, body = _next_call()
    reply, plan = await token_in.send(body, Plan([1, 2, 3], {"mode": "ids", "extends": 0}))
    assert plan.record["mode"] == "text" and plan.record["reason"] == "engine_refused_ids"
    assert (
        reply["choices"][0]["message"]["content"]
        == recorded("chat_basic")["response"]["choices"][0]["message"]["content"]
    )
    assert [r.path for r in inprocess_vllm.sent] == ["/v1/completions", "/v1/chat/completions"]
    assert token_in.unsupported
