"""Token-in against recorded real vLLM 0.32: `/tokenize` with messages and token-id completions.

The fake engine here answers a request only with the reply vLLM gave to that exact body
(tests/fixtures/vllm/tokenin_*, recorded by record.py's `tokenin` suite); any other body gets a
400, so a planner that asks for something vLLM was never asked fails these tests. Each recorded
conversation has turn 1 by chat, the four `/tokenize` calls token-in makes for turn 2, turn 2 as a
token-id completion, and turn 2 by chat (the text path) for comparison:

* greedy: turn 1 is cut by `max_tokens` (`length`), its reply re-tokenises canonically;
* stop: turn 1 ends with the `<|im_end|>` the model sampled;
* retok: turn 1 is sampled and cut, and its sampled ids are not the canonical tokenization of its
  text, so the text path's prompt breaks the prefix (at index 52) and token-in's does not.

The tool files (chat_tools_*, tokenin_tools_*) come from a server with `--tool-call-parser hermes`.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest

from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.upstream.client import EngineClient, parse_capture
from tapdeck.proxy.upstream.reasoning import MarkerCache
from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.proxy.upstream.token_in import (
    Plan,
    TokenIn,
    assistant_close,
    completion_as_chat,
    continuation_ids,
    difference,
)
from tests.support.fake_vllm import FakeVllm
from tests.support.recorded_turns import turn_from_fixture
from tests.support.vllm_recordings import TOKENIN_TOKENIZE_PARTS, smollm2_markers
from tests.support.vllm_recordings import vllm_fixture as recorded

SPEC = EngineSpec(url="http://vllm.test/v1", model="smollm2")
TAGS = ("greedy", "stop", "retok")
CLOSE = [2, 198]  # <|im_end|> "\n"


def _refusal(case: str) -> dict[str, Any]:
    """One recorded case of tokenize_errors.json (`{case, endpoint, request, status, body}`)."""
    return next(c for c in recorded("tokenize_errors")["cases"] if c["case"] == case)


def _engine(tag: str) -> FakeVllm:
    """The fake engine answering only the exact bodies vLLM answered for conversation `tag`."""
    tokenize = (f"tokenin_{tag}_tokenize_{p}" for p in TOKENIN_TOKENIZE_PARTS)
    return FakeVllm(
        answer=None, exchanges=(*tokenize, f"tokenin_{tag}_turn2_ids", "tokenize_reasoning_markers")
    )


def _client(engine: FakeVllm) -> EngineClient:
    return EngineClient(SPEC, http=engine.client())


def _held_graph(tag: str) -> RolloutGraph:
    g = RolloutGraph()
    g.add(turn_from_fixture(f"tokenin_{tag}_turn1", 0))
    return g


def _turn2(tag: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Turn 2 as the harness sends it, and the upstream body the proxy prepares (training tier)."""
    rec = recorded(f"tokenin_{tag}_turn2_chat")["request"]
    request = {k: copy.deepcopy(rec[k]) for k in ("messages", "max_tokens", "temperature")}
    if rec["top_logprobs"]:
        request.update(logprobs=True, top_logprobs=rec["top_logprobs"])
    upstream, _ = EngineClient(SPEC).prepare(request, "tokens", "smollm2", True)
    return request, upstream


@pytest.mark.parametrize("tag", TAGS)
def test_recorded_text_path_call_is_the_body_the_proxy_prepares(tag):
    """The chat turn 2 on record is exactly what the text path sends (less `stream: false`)."""
    _, upstream = _turn2(tag)
    assert upstream.pop("stream") is False
    assert upstream == recorded(f"tokenin_{tag}_turn2_chat")["request"]


@pytest.mark.parametrize("tag", TAGS)
def test_tokenize_boundaries_agree_with_vllms_chat_prompts(tag):
    """vLLM's `/tokenize` renders are its chat prompts: turn 1's prompt is the history with the
    generation prompt, turn 2's the full conversation; the held render is that prompt cut right
    after the template's close of the held reply."""
    tok = {p: recorded(f"tokenin_{tag}_tokenize_{p}")["response"]["tokens"] for p in TOKENIN_TOKENIZE_PARTS}
    turn1 = recorded(f"tokenin_{tag}_turn1")["response"]
    turn2 = recorded(f"tokenin_{tag}_turn2_chat")["response"]
    assert tok["history_gen"] == turn1["prompt_token_ids"]
    assert tok["full"] == turn2["prompt_token_ids"]
    assert assistant_close(tok["history_gen"], tok["history_empty"]) == CLOSE
    end = turn2["prompt_token_ids"].index(2, len(turn1["prompt_token_ids"]))
    assert tok["held"] == turn2["prompt_token_ids"][: end + len(CLOSE)]


def test_close_after_an_empty_reply_is_the_close_after_any_reply():
    """Token-in derives the close from an empty assistant message; vLLM closes a non-empty one the
    same way (its render without vs with `continue_final_message`)."""
    closed = recorded("tokenize_chat_assistant_last")["response"]["tokens"]
    open_ = recorded("tokenize_chat_continue")["response"]["tokens"]
    assert closed[: len(open_)] == open_ and closed[len(open_) :] == CLOSE
    empty = recorded("tokenin_stop_tokenize_history_empty")["response"]["tokens"]
    assert assistant_close(recorded("tokenize_chat_gen")["response"]["tokens"], empty) == CLOSE


@pytest.mark.parametrize("tag", TAGS)
async def test_planner_asks_what_vllm_answered_and_builds_the_recorded_prompt(tag):
    engine = _engine(tag)
    request, upstream = _turn2(tag)
    plan = await TokenIn(_client(engine), marker_cache=MarkerCache()).plan(
        _held_graph(tag), request, upstream
    )
    sent = recorded(f"tokenin_{tag}_turn2_ids")["request"]
    assert plan.record["mode"] == "ids", plan.record
    assert plan.prompt_ids == sent["prompt"]
    asked = sorted(json.dumps(s.body, sort_keys=True) for s in engine.sent)
    # The four renders, and once per engine the reasoning-marker probe (SmolLM2 has none).
    assert asked == sorted(
        json.dumps(recorded(name)["request"], sort_keys=True)
        for name in [
            *(f"tokenin_{tag}_tokenize_{p}" for p in TOKENIN_TOKENIZE_PARTS),
            "tokenize_reasoning_markers",
        ]
    )
    assert {s.path for s in engine.sent} == {"/tokenize"}


@pytest.mark.parametrize(("tag", "diverge_at"), [("greedy", None), ("stop", None), ("retok", 52)])
async def test_token_in_prompt_is_vllms_text_prompt_unless_the_reply_retokenises(tag, diverge_at):
    engine = _engine(tag)
    request, upstream = _turn2(tag)
    plan = await TokenIn(_client(engine)).plan(_held_graph(tag), request, upstream)
    turn1 = recorded(f"tokenin_{tag}_turn1")["response"]
    text_prompt = recorded(f"tokenin_{tag}_turn2_chat")["response"]["prompt_token_ids"]
    stored = turn1["prompt_token_ids"] + turn1["choices"][0]["token_ids"]
    assert plan.prompt_ids[: len(stored)] == stored
    if diverge_at is None:
        assert plan.prompt_ids == text_prompt
        assert plan.record["same"] is True
    else:
        assert plan.record["same"] is False and plan.record["diverge_at"] == diverge_at
        assert difference(text_prompt, plan.prompt_ids)["diverge_at"] == diverge_at
        assert text_prompt[: len(stored)] != stored


def test_sampled_end_token_is_kept_once_and_a_cut_reply_gets_the_close():
    stop, greedy = (
        recorded("tokenin_stop_turn2_ids")["request"],
        recorded("tokenin_greedy_turn2_ids")["request"],
    )
    for tag, prompt in (("stop", stop["prompt"]), ("greedy", greedy["prompt"])):
        turn1 = recorded(f"tokenin_{tag}_turn1")["response"]
        n = len(turn1["prompt_token_ids"]) + len(turn1["choices"][0]["token_ids"])
        after = prompt[n - 1 : n + 2]
        if turn1["choices"][0]["finish_reason"] == "stop":
            assert after == [2, 198, 1]  # sampled <|im_end|>, then only the "\n" of the close
        else:
            assert after[1:] == CLOSE


@pytest.mark.parametrize("tag", TAGS)
async def test_token_id_completion_sent_is_the_recorded_one_and_reads_back(tag):
    engine = _engine(tag)
    request, upstream = _turn2(tag)
    token_in = TokenIn(_client(engine))
    plan = await token_in.plan(_held_graph(tag), request, upstream)
    reply, followed = await token_in.send(upstream, plan)
    rec = recorded(f"tokenin_{tag}_turn2_ids")
    assert followed is plan and (engine.sent[-1].path, engine.sent[-1].body) == (
        "/v1/completions",
        rec["request"],
    )
    raw = rec["response"]["choices"][0]
    cap = parse_capture(reply)
    assert cap.prompt_ids.tolist() == raw["prompt_token_ids"] == plan.prompt_ids
    assert cap.sampled_ids.tolist() == raw["token_ids"]
    assert cap.logprobs.tolist() == raw["logprobs"]["token_logprobs"]
    assert cap.token_texts == raw["logprobs"]["tokens"]
    assert reply["choices"][0]["message"]["content"] == raw["text"]
    assert reply["usage"]["completion_tokens"] == len(raw["token_ids"])


@pytest.mark.parametrize("tag", ["greedy", "stop"])
async def test_token_in_reply_equals_vllms_chat_reply_for_the_same_prompt(tag):
    """Same prompt ids, greedy: the completion, turned into a chat reply, is the chat reply vLLM
    gave on the text path: content, ids, logprobs, token texts, bytes and top alternatives."""
    engine = _engine(tag)
    request, upstream = _turn2(tag)
    token_in = TokenIn(_client(engine))
    plan = await token_in.plan(_held_graph(tag), request, upstream)
    reply, _ = await token_in.send(upstream, plan)
    chat = recorded(f"tokenin_{tag}_turn2_chat")["response"]
    ours, theirs = reply["choices"][0], chat["choices"][0]
    assert ours["message"]["content"] == theirs["message"]["content"]
    assert (ours["finish_reason"], ours["token_ids"]) == (theirs["finish_reason"], theirs["token_ids"])
    assert reply["prompt_token_ids"] == chat["prompt_token_ids"]
    assert ours["logprobs"]["content"] == theirs["logprobs"]["content"]
    a, b = parse_capture(reply), parse_capture(chat)
    for x, y in zip(a[:3], b[:3], strict=True):
        np.testing.assert_array_equal(x, y)
    assert a.token_texts == b.token_texts and a.top_logprobs == b.top_logprobs


async def test_tokenize_refusal_for_these_messages_keeps_token_in_for_later_calls():
    """vLLM's 400 on `/tokenize` (recorded: both `continue_final_message` and a generation prompt)
    is about that body: this call goes as text, the next may still go as ids."""
    engine = _engine("greedy")
    refusal = _refusal("tokenize_continue_and_generation_prompt")
    status, body = refusal["status"], refusal["body"]
    engine.add("/tokenize", recorded("tokenin_greedy_tokenize_full")["request"], status, body)
    token_in = TokenIn(_client(engine))
    request, upstream = _turn2("greedy")
    plan = await token_in.plan(_held_graph("greedy"), request, upstream)
    assert plan.record["reason"] == "tokenize_failed" and plan.record["extends"] == 0
    assert body["error"]["message"] in plan.record["detail"]
    assert token_in.unsupported is None


async def test_vllm_refusing_a_token_id_prompt_sends_the_call_as_text():
    """vLLM 0.32 answers 400 for an out-of-vocabulary prompt id (recorded); the call is retried on
    the chat route and later calls take text."""
    case = _refusal("completions_prompt_id_out_of_vocab")
    chat = recorded("tokenin_greedy_turn2_chat")["response"]
    engine = FakeVllm(answer=None)
    engine.add("/v1/completions", None, case["status"], case["body"])
    engine.add("/v1/chat/completions", None, 200, chat)
    token_in = TokenIn(_client(engine))
    _, upstream = _turn2("greedy")
    reply, plan = await token_in.send(upstream, Plan(case["request"]["prompt"], {"mode": "ids"}))
    assert plan.record["reason"] == "engine_refused_ids"
    assert "out of vocabulary" in plan.record["detail"]
    assert [s.path for s in engine.sent] == ["/v1/completions", "/v1/chat/completions"]
    assert engine.sent[0].body["prompt"] == case["request"]["prompt"]
    assert reply["choices"][0]["token_ids"] == chat["choices"][0]["token_ids"]
    assert token_in.unsupported


async def test_turn_after_a_vllm_tool_call_breaks_the_prefix_and_stays_on_text():
    """Real vLLM with SmolLM2's own template (which knows no `tool_calls`): the assistant turn that
    held only a tool call renders empty, so the next prompt drops the sampled `<tool_call>` ids
    right after turn 1's prompt. The graph records a break, and only a continuation by ids repairs
    it: token-in plans this call as text without asking the engine (its spec names no tool
    parser). The embedded engine renders the call into the prompt and keeps the prefix."""
    call = recorded("chat_tools_call")["response"]
    nxt = recorded("chat_tools_result")
    assert call["choices"][0]["finish_reason"] == "tool_calls"
    n = len(call["prompt_token_ids"])
    assert nxt["response"]["prompt_token_ids"][:n] == call["prompt_token_ids"]
    assert nxt["response"]["prompt_token_ids"][n : n + 5] == [2, 198, 1, 19324, 198]  # …<|im_start|>tool\n
    assert call["choices"][0]["token_ids"][:2] != [2, 198]
    g = RolloutGraph()
    g.add(turn_from_fixture("chat_tools_call", 0))
    link = g.add(turn_from_fixture("chat_tools_result", 1))
    assert (link.parent, link.offset) == (0, n) and link.kind != "prefix" and g.stats().breaks == 1
    request = {k: copy.deepcopy(nxt["request"][k]) for k in ("messages", "tools", "max_tokens")}
    upstream, _ = EngineClient(SPEC).prepare(request, "tokens", "smollm2", True)
    engine = FakeVllm(answer=None)
    plan = await TokenIn(_client(engine), marker_cache=smollm2_markers()).plan(g, request, upstream)
    assert plan.prompt_ids is None and plan.record["mode"] == "text" and not engine.sent


def test_turn_after_a_tool_call_splits_at_the_message_boundary_and_keeps_the_call():
    """The `/tokenize` boundary method on vLLM's renders of a tool-call conversation: the held
    render (its empty assistant turn) is a prefix of the full one, so the new `tool` message's
    ids come out exactly; the ids prompt keeps the sampled `<tool_call>` ids the text path drops,
    and vLLM continued from it (recorded, same reply text as the text path here)."""
    tok = {p: recorded(f"tokenin_tools_tokenize_{p}")["response"]["tokens"] for p in TOKENIN_TOKENIZE_PARTS}
    call = recorded("chat_tools_call")["response"]
    text = recorded("chat_tools_result")["response"]
    close = assistant_close(tok["history_gen"], tok["history_empty"])
    sampled = call["choices"][0]["token_ids"]
    stored = call["prompt_token_ids"] + sampled
    ids = continuation_ids(
        stored, sampled, call["choices"][0]["finish_reason"], close, tok["held"], tok["full"]
    )
    sent = recorded("tokenin_tools_turn2_ids")
    assert ids == sent["request"]["prompt"] and ids[: len(stored)] == stored
    assert tok["full"] == text["prompt_token_ids"]
    assert difference(text["prompt_token_ids"], ids)["diverge_at"] == len(call["prompt_token_ids"])
    reply = completion_as_chat(sent["response"], top_k=2)
    assert reply["prompt_token_ids"] == ids
    assert reply["choices"][0]["message"]["content"] == text["choices"][0]["message"]["content"]


def test_token_id_completion_of_a_tool_call_is_raw_text_the_proxy_must_parse():
    """vLLM parses tool calls on its chat route only. The same prompt as a token-id completion
    (greedy, recorded) samples the same ids and logprobs, but answers the `<tool_call>` block as
    text with finish `stop`: read back as a chat reply it is content, not a call, until the proxy
    parses it (tests/runner/engine/test_tool_calls.py parses it to vLLM's own call)."""
    chat = recorded("chat_tools_call")["response"]["choices"][0]
    raw = recorded("tokenin_tools_call_ids")["response"]
    reply = completion_as_chat(raw, top_k=2)["choices"][0]
    assert reply["token_ids"] == chat["token_ids"]
    assert reply["logprobs"]["content"] == chat["logprobs"]["content"]
    assert reply["finish_reason"] == "stop" != chat["finish_reason"] == "tool_calls"
    assert reply["message"]["content"].startswith("<tool_call>") and "tool_calls" not in reply["message"]


async def test_a_token_in_continuation_keeps_the_routing_of_its_whole_prompt() -> None:
    """MoE routing as vLLM sends it (base64 `.npy`, one row per token but the last) on the
    recorded token-id completion: the turn keeps it, over the continued prompt and the reply."""
    import base64
    import io

    engine = _engine("greedy")
    request, upstream = _turn2("greedy")
    rec = recorded("tokenin_greedy_turn2_ids")
    response = copy.deepcopy(rec["response"])
    choice = response["choices"][0]
    assert choice["routed_experts"] is None  # recorded with the flag off
    rows = len(choice["prompt_token_ids"]) + len(choice["token_ids"]) - 1
    routing = np.arange(rows * 4 * 2, dtype=np.uint16).reshape(rows, 4, 2)
    buf = io.BytesIO()
    np.save(buf, routing, allow_pickle=False)
    choice["routed_experts"] = base64.b64encode(buf.getvalue()).decode("ascii")
    engine.add("/v1/completions", rec["request"], 200, response)
    token_in = TokenIn(_client(engine))
    plan = await token_in.plan(_held_graph("greedy"), request, upstream)
    reply, _ = await token_in.send(upstream, plan)
    cap = parse_capture(reply)
    assert cap.findings == [] and cap.routed_experts is not None
    assert np.array_equal(cap.routed_experts, routing)
    # The held turn's ids and the new ones: the prompt token-in continued, every row of it.
    assert (
        cap.prompt_ids.size + cap.sampled_ids.size - 1 == rows
        and plan.prompt_ids == choice["prompt_token_ids"]
    )
