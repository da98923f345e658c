"""Token-in with the hermes tool parser against real vLLM 0.32 (recorded on a server with
`--enable-auto-tool-choice --tool-call-parser hermes`): a tool call sampled on the completions
route reads back as the chat route's call, and the turn after a call continues by ids.

vLLM's SmolLM2 template ignores `tools` (recorded: `/tokenize` gives the same ids with and without
them), and SmolLM2's `<tool_call>` is not a special token, so the recorded bodies without `tools`
and without `skip_special_tokens` answer the ones token-in sends with them; each test checks the
fact it leans on.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.upstream.client import EngineClient
from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.proxy.upstream.token_in import TokenIn, completion_as_chat
from tapdeck.proxy.upstream.toolcalls import TOOL_PARSERS
from tests.support.fake_vllm import FakeVllm
from tests.support.recorded_turns import turn_from_fixture
from tests.support.vllm_recordings import TOKENIN_TOKENIZE_PARTS
from tests.support.vllm_recordings import vllm_fixture as recorded

SPEC = EngineSpec(url="http://vllm.test/v1", model="smollm2")

HERMES = TOOL_PARSERS["hermes"]
CALL_ID = re.compile(r"chatcmpl-tool-[0-9a-f]{16}")
SPECIAL_IDS = range(17)  # SmolLM2's special tokens: <|endoftext|>, <|im_start|>, <|im_end|>, …


def _without_ids(message: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(message)
    for call in out.get("tool_calls") or []:
        assert CALL_ID.fullmatch(call.pop("id"))
    return out


def test_tool_call_sampled_by_ids_reads_back_as_vllms_chat_route_call():
    """The same prompt ids, greedy, on both routes (recorded): the completions route answers the
    call as raw text; parsed with hermes it is the chat route's reply, id format included."""
    completion = recorded("tokenin_tools_call_ids")["response"]
    chat = recorded("chat_tools_call")["response"]
    ours = completion_as_chat(completion, top_k=2, parser=HERMES)
    a, b = ours["choices"][0], chat["choices"][0]
    assert _without_ids(a["message"]) == _without_ids(b["message"])
    assert (
        (a["finish_reason"], a["stop_reason"])
        == (b["finish_reason"], b["stop_reason"])
        == ("tool_calls", None)
    )
    assert a["token_ids"] == b["token_ids"] and a["logprobs"] == b["logprobs"]
    assert ours["prompt_token_ids"] == chat["prompt_token_ids"]


def without_what_vllm_was_not_sent(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Token-in's body as the recorded one it stands for: `/tokenize` without `tools` (vLLM
    answered it without them), the completion without `skip_special_tokens`."""
    drop = {"/tokenize": "tools", "/v1/completions": "skip_special_tokens"}[path]
    return {k: v for k, v in body.items() if k != drop}


async def test_turn_after_a_tool_call_continues_by_ids_with_the_hermes_parser():
    """vLLM's text path drops the sampled call from the next prompt (its template renders the
    assistant turn empty); token-in keeps the call's ids and adds the `tool` message's ids from
    the `/tokenize` boundary, and vLLM's completion reads back as the chat reply it gave."""
    assert (
        recorded("tokenize_chat_tools")["response"]["tokens"]
        == recorded("tokenize_chat_gen")["response"]["tokens"]
    )  # tools render nothing here
    sent = recorded("tokenin_tools_turn2_ids")
    assert not set(sent["response"]["choices"][0]["token_ids"][:-1]) & set(SPECIAL_IDS)
    engine = FakeVllm(
        answer=None,
        recorded_as=without_what_vllm_was_not_sent,
        exchanges=(
            *(f"tokenin_tools_tokenize_{p}" for p in TOKENIN_TOKENIZE_PARTS),
            "tokenin_tools_turn2_ids",
        ),
    )
    graph = RolloutGraph()
    graph.add(turn_from_fixture("chat_tools_call", 0))
    nxt = recorded("chat_tools_result")
    request = {
        k: copy.deepcopy(nxt["request"][k])
        for k in ("messages", "tools", "max_tokens", "temperature", "logprobs", "top_logprobs")
    }
    upstream, _ = EngineClient(SPEC).prepare(request, "tokens", "smollm2", False)
    token_in = TokenIn(EngineClient(SPEC, http=engine.client()), tool_parser="hermes")
    plan = await token_in.plan(graph, request, upstream)
    assert (plan.record["mode"], plan.record["tool_parser"]) == ("ids", "hermes"), plan.record
    assert plan.prompt_ids == sent["request"]["prompt"]
    reply, followed = await token_in.send(upstream, plan)
    assert followed is plan
    bodies = [s.body for s in engine.sent]  # as token-in sent them
    assert all(b["tools"] == request["tools"] for b in bodies[:4])
    assert bodies[4]["skip_special_tokens"] is False  # as hermes asks of the chat route
    assert reply["choices"][0]["message"] == nxt["response"]["choices"][0]["message"]
    assert reply["choices"][0]["finish_reason"] == "stop"
