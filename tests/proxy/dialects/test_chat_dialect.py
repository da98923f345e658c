"""capture-cases A6, A10, A11, B13, B15, B17, B19 for the chat-completions dialect.

Streams are checked against the recorded vLLM stream (chat_stream.json) and parsed by the real
OpenAI SDK."""

from __future__ import annotations

import copy

import httpx
import openai
import orjson
import pytest

from tapdeck.proxy.dialects import DIALECTS, detect
from tapdeck.proxy.dialects.base import DialectError, DialectRequest, SSEEvent
from tapdeck.proxy.dialects.chat import DIALECT as chat
from tapdeck.proxy.dialects.chat import fold_system_messages, merge_system_messages
from tapdeck.proxy.http.sse import encode

TOOL_REPLY_MESSAGE = {
    "role": "assistant",
    "content": None,
    "refusal": None,
    "annotations": None,
    "audio": None,
    "function_call": None,
    "reasoning": None,
    "tool_calls": [
        {
            "id": "chatcmpl-tool-1",
            "type": "function",
            "function": {"name": "ls", "arguments": '{"path": "."}'},
        }
    ],
}


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/V1/Chat/Completions",
        "/chat/completions",
        "/v1/chat/completions/",
        "/openai/v1/chat/completions?x=1",
    ],
)
def test_chat_path_detected_case_insensitively(path):
    assert chat.matches(path)
    assert detect(path) is chat


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/models", "/v1/chat", "/v1/messages"])
def test_other_paths_not_chat(path):
    assert not chat.matches(path)


def test_registry_lists_chat_first():
    assert DIALECTS[0] is chat and detect("/nope") is None


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/v1/responses", "responses"),
        ("/V1/RESPONSES", "responses"),
        ("/v1/messages", "anthropic"),
        ("/v1/Messages", "anthropic"),
        ("/v1beta/models/gemini-2.5-pro:generateContent", "google"),
        ("/v1beta/models/gemini-2.5-pro:streamGenerateContent", "google"),
        ("/v1beta/models/x:STREAMGENERATECONTENT", "google"),
    ],
)
def test_registry_detects_every_dialect_case_insensitively(path, name):
    found = detect(path)
    assert found is not None and found.name == name
    assert [d.name for d in DIALECTS] == ["chat", "responses", "anthropic", "google"]


def test_leading_system_messages_merge_and_later_ones_stay_in_place():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [
        {"role": "developer", "content": "Be terse."},
        {"role": "system", "content": [{"type": "text", "text": "Tools: ls"}, image]},
        {"role": "user", "content": "hi"},
        {"role": "developer", "content": "Reminder."},
    ]
    before = copy.deepcopy(messages)
    merged = merge_system_messages(messages)
    assert [m["role"] for m in merged] == ["system", "user", "system"]
    assert merged[0]["content"] == [
        {"type": "text", "text": "Be terse."},
        {"type": "text", "text": "Tools: ls"},
        image,
    ]
    assert merged[2] == {"role": "system", "content": "Reminder."}
    assert messages == before
    # For an engine whose template refuses late system messages, all of them fold into the first.
    folded = fold_system_messages(messages)
    assert [m["role"] for m in folded] == ["system", "user"]
    assert folded[0]["content"][-1] == {"type": "text", "text": "Reminder."}
    text_only = merge_system_messages(
        [
            {"role": "system", "content": "a"},
            {"role": "developer", "content": "b"},
            {"role": "user", "content": "q"},
        ]
    )
    assert text_only[0] == {"role": "system", "content": "a\n\nb"}


def test_single_leading_system_left_alone(vllm):
    messages = vllm("chat_basic")["request"]["messages"]
    assert merge_system_messages(messages) is messages


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"messages": []},
        {"messages": "hi"},
        {"messages": [{"content": "x"}]},
        {"messages": [{"role": "user", "content": "x"}], "n": 3},
    ],
)
def test_bad_requests_refused_with_400(bad):
    with pytest.raises(DialectError) as err:
        chat.parse(bad, "/v1/chat/completions", {})
    assert err.value.status == 400


def parse(vllm, **extra) -> DialectRequest:
    body = {
        k: v
        for k, v in vllm("chat_basic")["request"].items()
        if k not in ("return_token_ids", "logprobs", "top_logprobs")
    }
    body.update(extra)
    return chat.parse(body, "/v1/chat/completions", {})


def test_render_shows_client_model_and_zero_filled_usage(vllm):
    req = parse(vllm, model="gpt-4o-mini")
    reply = vllm("chat_basic")["response"]
    out = chat.render(reply, req)
    assert out["model"] == "gpt-4o-mini"
    assert out["usage"]["prompt_tokens_details"] == {"cached_tokens": 0, "audio_tokens": 0}
    assert out["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    # capture fields the client never asked for are not sent back
    assert "prompt_token_ids" not in out and "token_ids" not in out["choices"][0]
    assert out["choices"][0]["logprobs"] is None
    assert reply["model"] == "smollm2" and "prompt_token_ids" in reply  # input untouched


def test_render_keeps_capture_fields_the_client_asked_for(vllm):
    req = parse(vllm, return_token_ids=True, logprobs=True, top_logprobs=0)
    out = chat.render(vllm("chat_basic")["response"], req)
    assert out["prompt_token_ids"][:2] == [1, 9690] and out["choices"][0]["token_ids"][-1] == 2
    assert out["choices"][0]["logprobs"]["content"][0]["token"] == "The"


async def test_rendered_reply_parses_with_openai_sdk(vllm):
    req = parse(vllm, model="gpt-4o-mini")
    body = chat.render(vllm("chat_basic")["response"], req)
    sdk = openai.AsyncOpenAI(
        api_key="k",
        base_url="http://proxy.test/v1",
        http_client=httpx.AsyncClient(
            transport=httpx.MockTransport(lambda r: httpx.Response(200, json=body))
        ),
    )
    out = await sdk.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}])
    assert out.choices[0].message.content == "The capital of France is Paris."
    assert out.usage.prompt_tokens_details.cached_tokens == 0


def events(stream) -> list:
    return [e.data if isinstance(e.data, str) else dict(e.data) for e in stream]


def test_stream_matches_recorded_vllm_chunk_sequence(vllm):
    recorded = vllm("chat_stream")["events"]
    req = chat.parse({**vllm("chat_stream")["request"], "model": "smollm2"}, "/v1/chat/completions", {})
    assert req.stream and req.context["include_usage"]
    # the recorded stream's non-streaming twin (same greedy request) is chat_token_id_strings' ids
    reply = vllm("chat_basic")["response"]
    ours = events(chat.render_stream(reply, req))
    assert ours[-1] == recorded[-1] == "[DONE]"
    assert (
        ours[0]["choices"][0]["delta"]
        == recorded[0]["choices"][0]["delta"]
        == {"role": "assistant", "content": ""}
    )
    assert ours[0]["object"] == recorded[0]["object"] == "chat.completion.chunk"
    assert ours[-2]["choices"] == recorded[-2]["choices"] == []
    assert ours[-2]["usage"]["completion_tokens"] == 8
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in ours[:-2] if c["choices"])
    assert text == "The capital of France is Paris."
    finish = [c["choices"][0]["finish_reason"] for c in ours[:-2]]
    assert finish[-1] == "stop" and set(finish[:-1]) == {None}
    assert all(c["model"] == "smollm2" for c in ours[:-1])


def test_stream_without_include_usage_has_no_usage_chunk(vllm):
    req = parse(vllm, stream=True)
    ours = events(chat.render_stream(vllm("chat_basic")["response"], req))
    assert all(c == "[DONE]" or c["choices"] for c in ours)
    assert all("usage" not in c for c in ours if c != "[DONE]")


async def sdk_stream(payload: bytes) -> list:
    sdk = openai.AsyncOpenAI(
        api_key="k",
        base_url="http://proxy.test/v1",
        http_client=httpx.AsyncClient(
            transport=httpx.MockTransport(
                lambda r: httpx.Response(200, content=payload, headers={"content-type": "text/event-stream"})
            )
        ),
    )
    stream = await sdk.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "x"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    return [chunk async for chunk in stream]


async def test_tool_call_stream_reassembles_in_openai_sdk(vllm):
    reply = vllm("chat_basic")["response"]
    reply["choices"][0]["message"] = TOOL_REPLY_MESSAGE
    reply["choices"][0]["finish_reason"] = "tool_calls"
    req = parse(vllm, model="m", stream=True, stream_options={"include_usage": True})
    payload = b"".join(encode(e) for e in chat.render_stream(reply, req))
    assert payload.endswith(b"data: [DONE]\n\n")
    chunks = await sdk_stream(payload)
    calls: dict[int, dict] = {}
    for c in chunks:
        for choice in c.choices:
            for tc in choice.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                slot["name"] += tc.function.name or ""
                slot["arguments"] += tc.function.arguments or ""
    assert calls == {0: {"name": "ls", "arguments": '{"path": "."}'}}
    assert chunks[-1].usage.total_tokens == 45
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_error_body_matches_vllm_envelope(vllm_error):
    status, recorded = vllm_error("empty_tools")
    ours = chat.error_body(status, recorded["error"]["message"], recorded["error"]["type"], "tools")
    assert ours == recorded


async def test_stream_error_is_sse_error_then_done():
    payload = b"".join(
        encode(e) for e in chat.stream_error(502, "engine at http://x/v1 is unreachable", "api_error")
    )
    assert payload.endswith(b"data: [DONE]\n\n")
    first = orjson.loads(payload.split(b"\n\n")[0].removeprefix(b"data: "))
    assert first["error"]["code"] == 502
    with pytest.raises(openai.APIError) as err:
        await sdk_stream(payload)
    assert "unreachable" in str(err.value)


async def _sdk_calls(payload: bytes) -> tuple[dict[int, dict], str | None, str]:
    """Tool calls, last finish reason and content text the OpenAI SDK reassembles from a stream."""
    calls: dict[int, dict] = {}
    finish, text = None, ""
    for c in await sdk_stream(payload):
        for choice in c.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for tc in choice.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                slot["name"] += tc.function.name or ""
                slot["arguments"] += tc.function.arguments or ""
    return calls, finish, text


async def test_tool_call_stream_from_recorded_vllm_reply_reassembles_like_vllms_own(vllm):
    """The proxy streams a reply from the whole one (stream off upstream): for a real vLLM hermes
    tool call, the SDK reassembles the same call, finish reason and (empty) content from it as
    from vLLM's own stream of the same request."""
    rec = vllm("chat_tools_call_stream")
    theirs = await _sdk_calls(b"".join(encode(SSEEvent(e)) for e in rec["events"]))
    req = chat.parse(rec["request"], "/v1/chat/completions", {})
    reply = vllm("chat_tools_call")["response"]
    ours = await _sdk_calls(b"".join(encode(e) for e in chat.render_stream(reply, req)))
    assert ours == theirs
    assert (
        theirs[0]
        == {
            0: {
                "name": "run_shell",
                "arguments": reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            }
        }
        and theirs[1] == "tool_calls"
    )
