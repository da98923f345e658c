"""Anthropic Messages ⇄ chat translation (capture-cases A8, A11, B13, B15, B17, B19)."""

from __future__ import annotations

import json

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from tapdeck.proxy.dialects import detect
from tapdeck.proxy.dialects.anthropic import DIALECT, strip_billing_header
from tapdeck.proxy.dialects.base import DialectError
from tests.support.vllm_recordings import vllm_fixture

BILLING = "x-anthropic-billing-header: cc_version=2.1.80.a1b; cc_entrypoint=cli; cch=7f3e9;"


def parse(body: dict, path: str = "/v1/messages"):
    return DIALECT.parse(body, path, {})


def test_anthropic_paths_detected_case_insensitively() -> None:
    assert detect("/v1/messages").name == "anthropic"
    assert detect("/V1/Messages?beta=true").name == "anthropic"
    assert detect("/v1/messages/count_tokens").name == "anthropic"
    assert not DIALECT.matches("/v1/chat/completions")


def test_system_blocks_joined_and_billing_line_removed() -> None:
    body = {
        "model": "claude-x",
        "max_tokens": 64,
        "system": [
            {"type": "text", "text": BILLING},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Be brief."},
        ],
        "messages": [{"role": "user", "content": "hi"}],
    }
    chat = parse(body).chat
    assert chat["messages"][0] == {"role": "system", "content": "You are Claude Code.\n\nBe brief."}
    other = json.loads(json.dumps(body))
    other["system"][0]["text"] = BILLING.replace("7f3e9", "00000")
    assert parse(other).chat["messages"] == chat["messages"]


def test_billing_line_inside_a_system_string_removed() -> None:
    text = f"{BILLING}\nYou are Claude Code."
    assert strip_billing_header(text) == "You are Claude Code."
    chat = parse({"system": text, "messages": [{"role": "user", "content": "x"}]}).chat
    assert chat["messages"][0]["content"] == "You are Claude Code."


def test_system_messages_inside_messages_stay_in_place_unless_they_lead() -> None:
    # Folding a later one into the leading system prompt would change the prompt's start (issue 17).
    chat = parse(
        {
            "system": "Base.",
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "system", "content": f"{BILLING}\nLater."},
            ],
        }
    ).chat
    assert chat["messages"] == [
        {"role": "system", "content": "Base."},
        {"role": "user", "content": "a"},
        {"role": "system", "content": "Later."},
    ]
    chat = parse(
        {
            "system": "Base.",
            "messages": [{"role": "system", "content": "First."}, {"role": "user", "content": "a"}],
        }
    ).chat
    assert chat["messages"] == [
        {"role": "system", "content": "Base.\n\nFirst."},
        {"role": "user", "content": "a"},
    ]


def test_tool_round_trip_history_becomes_chat_tool_calls_and_results() -> None:
    body = {
        "model": "claude-x",
        "max_tokens": 100,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "stop_sequences": ["END"],
        "tools": [
            {
                "name": "bash",
                "description": "Run a command",
                "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            },
            {"type": "web_search_20250305", "name": "web_search"},
        ],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "list files"}, {"type": "text", "text": "please"}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should run ls.", "signature": "sig"},
                    {"type": "text", "text": "Running ls."},
                    {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"cmd": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01",
                        "content": [{"type": "text", "text": "a.txt"}, {"type": "text", "text": "b.py"}],
                    },
                    {"type": "text", "text": "<system-reminder>go on</system-reminder>"},
                ],
            },
        ],
    }
    chat = parse(body).chat
    assert chat["messages"] == [
        {"role": "user", "content": "list files\nplease"},
        {
            "role": "assistant",
            "content": "Running ls.",
            "reasoning_content": "I should run ls.",
            "tool_calls": [
                {
                    "id": "toolu_01",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"cmd": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_01", "content": "a.txt\nb.py"},
        {"role": "user", "content": "<system-reminder>go on</system-reminder>"},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "Run a command",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            },
        }
    ]
    assert chat["tool_choice"] == "auto" and chat["parallel_tool_calls"] is False
    assert (chat["max_tokens"], chat["temperature"], chat["top_p"], chat["top_k"]) == (100, 0.2, 0.9, 40)
    assert chat["stop"] == ["END"]
    # The same history re-sent translates identically.
    assert parse(json.loads(json.dumps(body))).chat == chat


def test_server_tools_dropped_and_listed_by_type() -> None:
    req = parse(
        {
            "model": "claude-x",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
            "tools": [
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
                {"name": "bash", "input_schema": {"type": "object", "properties": {}}},
                {"type": "code_execution_20250522", "name": "code_execution"},
                {"type": "bash_20250124", "name": "bash"},
                {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
            ],
        }
    )
    assert [t["function"]["name"] for t in req.chat["tools"]] == ["bash"]
    assert req.context["dropped_tools"] == [
        "web_search_20250305",
        "code_execution_20250522",
        "bash_20250124",
        "text_editor_20250728",
    ]
    assert (
        parse({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}).context[
            "dropped_tools"
        ]
        == []
    )


def test_tool_use_input_re_sent_as_the_sampled_arguments_text(tool_reply) -> None:
    """The engine sampled `{"cmd":"ls"}` (no space); the next request renders that exact string."""
    req = parse({"messages": [{"role": "user", "content": "go"}]})
    body = DIALECT.render(tool_reply([("bash", '{"cmd":"ls -la"}')]), req)
    block = body["content"][0]
    follow = parse(
        {
            "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": [block]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": block["id"], "content": "x"}],
                },
            ]
        }
    )
    assert follow.chat["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"cmd":"ls -la"}'


@pytest.mark.parametrize(
    "block",
    [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}},
    ],
)
def test_image_content_refused_with_400(block) -> None:
    with pytest.raises(DialectError) as err:
        parse({"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, block]}]})
    assert err.value.status == 400 and "text-only" in err.value.message
    body = DIALECT.error_body(400, err.value.message, err.value.kind)
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"


def test_image_inside_tool_result_refused() -> None:
    with pytest.raises(DialectError):
        parse(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [
                                    {
                                        "type": "image",
                                        "source": {"type": "base64", "media_type": "image/png", "data": "AA"},
                                    }
                                ],
                            }
                        ],
                    }
                ]
            }
        )


def test_tool_choice_any_and_named() -> None:
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    msgs = [{"role": "user", "content": "x"}]
    assert (
        parse({"messages": msgs, "tools": tools, "tool_choice": {"type": "any"}}).chat["tool_choice"]
        == "required"
    )
    named = parse({"messages": msgs, "tools": tools, "tool_choice": {"type": "tool", "name": "f"}}).chat
    assert named["tool_choice"] == {"type": "function", "function": {"name": "f"}}


def test_output_config_json_schema_becomes_response_format() -> None:
    chat = parse(
        {
            "messages": [{"role": "user", "content": "x"}],
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
        }
    ).chat
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": {"type": "object"}},
    }


def test_stream_flag_read_from_body() -> None:
    assert parse({"messages": [{"role": "user", "content": "x"}], "stream": True}).stream is True
    assert parse({"messages": [{"role": "user", "content": "x"}]}).stream is False


def test_reply_text_usage_and_end_turn(basic_reply) -> None:
    req = parse({"model": "claude-sonnet", "messages": [{"role": "user", "content": "q"}]})
    body = DIALECT.render(basic_reply, req)
    message = Message.model_validate(body)
    assert message.content[0].text == "The capital of France is Paris."
    assert message.model == "claude-sonnet" and message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (37, 8)


def test_reply_max_tokens_stop(length_reply) -> None:
    body = DIALECT.render(length_reply, parse({"messages": [{"role": "user", "content": "q"}]}))
    assert body["stop_reason"] == "max_tokens"


def test_reply_stop_sequence(basic_reply) -> None:
    basic_reply["choices"][0]["stop_reason"] = "Paris"
    req = parse({"messages": [{"role": "user", "content": "q"}], "stop_sequences": ["Paris"]})
    body = DIALECT.render(basic_reply, req)
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "Paris")


def test_tool_call_reply_becomes_tool_use_blocks(tool_reply) -> None:
    req = parse({"messages": [{"role": "user", "content": "weather?"}]})
    body = DIALECT.render(tool_reply([("get_weather", '{"city": "Paris"}'), ("bash", '{"cmd": "ls"}')]), req)
    message = Message.model_validate(body)
    assert message.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in message.content] == [
        ("tool_use", "get_weather", {"city": "Paris"}),
        ("tool_use", "bash", {"cmd": "ls"}),
    ]
    assert message.content[0].id == "chatcmpl-tool-0abc"


def test_reasoning_reply_becomes_thinking_block(reasoning_reply) -> None:
    body = DIALECT.render(reasoning_reply, parse({"messages": [{"role": "user", "content": "q"}]}))
    assert body["content"][0] == {
        "type": "thinking",
        "thinking": "France's capital is Paris.",
        "signature": "",
    }
    assert body["content"][1]["type"] == "text"


def test_stream_event_sequence_for_text_and_tool_use(tool_reply) -> None:
    req = parse({"model": "m", "messages": [{"role": "user", "content": "q"}], "stream": True})
    events = list(DIALECT.render_stream(tool_reply([("bash", '{"cmd": "ls"}')], text="Running."), req))
    names = [e.event for e in events]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    adapter = TypeAdapter(RawMessageStreamEvent)
    for e in events:
        assert e.data["type"] == e.event
        adapter.validate_python(e.data)
    assert events[2].data["delta"] == {"type": "text_delta", "text": "Running."}
    assert events[4].data["content_block"]["type"] == "tool_use"
    assert json.loads(events[5].data["delta"]["partial_json"]) == {"cmd": "ls"}
    assert events[5].data["delta"]["type"] == "input_json_delta"
    assert events[7].data["delta"]["stop_reason"] == "tool_use"
    assert events[7].data["usage"]["output_tokens"] == 8


@pytest.mark.parametrize(
    "status, kind, expected",
    [
        (401, "authentication_error", "authentication_error"),
        (400, "invalid_request_error", "invalid_request_error"),
        (502, "upstream_5xx", "api_error"),
        (404, "not_found_error", "not_found_error"),
    ],
)
def test_error_envelope(status, kind, expected) -> None:
    body = DIALECT.error_body(status, "boom", kind)
    assert body == {"type": "error", "error": {"type": expected, "message": "boom"}}
    events = list(DIALECT.stream_error(status, "boom", kind))
    assert [e.event for e in events] == ["error"] and events[0].data == body


def test_missing_messages_refused() -> None:
    with pytest.raises(DialectError) as err:
        parse({"model": "m"})
    assert err.value.status == 400


def test_recorded_vllm_tool_call_becomes_tool_use_and_is_resent_verbatim() -> None:
    """A real vLLM 0.32 hermes tool-call reply (chat_tools_call.json): a `tool_use` block the
    Anthropic SDK accepts, and the next request gives vLLM back its own arguments string."""
    reply = vllm_fixture("chat_tools_call")["response"]
    [call] = reply["choices"][0]["message"]["tool_calls"]
    req = parse({"messages": [{"role": "user", "content": "Show me what is in the current directory."}]})
    message = Message.model_validate(DIALECT.render(reply, req))
    assert message.stop_reason == "tool_use"
    [block] = message.content
    assert (block.type, block.id, block.name, block.input) == (
        "tool_use",
        call["id"],
        "run_shell",
        json.loads(call["function"]["arguments"]),
    )
    follow = parse(
        {
            "messages": [
                {"role": "user", "content": "Show me what is in the current directory."},
                {"role": "assistant", "content": [block.model_dump(exclude_none=True)]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": block.id, "content": "foo.txt\nbar.py"}
                    ],
                },
            ]
        }
    )
    assert follow.chat["messages"][1]["tool_calls"] == [call]
