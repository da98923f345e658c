"""Google generateContent ⇄ chat translation (capture-cases A11, B13, B14, B16, B19)."""

from __future__ import annotations

import json

import pytest
from google.genai import types

from tapdeck.proxy.dialects import detect
from tapdeck.proxy.dialects.base import DialectError
from tapdeck.proxy.dialects.google import DIALECT, is_streaming

PATH = "/v1beta/models/gemini-2.5-flash:generateContent"


def parse(body: dict, path: str = PATH, query: dict | None = None):
    return DIALECT.parse(body, path, query or {})


def test_google_paths_detected_case_insensitively() -> None:
    assert detect("/v1beta/models/g:streamGenerateContent").name == "google"
    assert detect("/V1BETA/MODELS/G:GENERATECONTENT").name == "google"
    assert detect("/v1beta/models/g:countTokens").name == "google"


@pytest.mark.parametrize(
    "path, query, expected",
    [
        ("/v1beta/models/g:streamGenerateContent", {}, True),
        ("/v1beta/models/g:STREAMGENERATECONTENT", {}, True),
        ("/v1beta/models/g:generateContent", {"alt": "sse"}, True),
        ("/v1beta/models/g:generateContent", {"ALT": "SSE"}, True),
        ("/v1beta/models/g:generateContent", {}, False),
        ("/v1beta/models/g:generateContent", {"alt": "json"}, False),
    ],
)
def test_google_stream_detected_from_path_and_query_case_insensitively(path, query, expected) -> None:
    assert is_streaming(path, query) is expected
    assert parse({"contents": [{"role": "user", "parts": [{"text": "x"}]}]}, path, query).stream is expected


def test_system_instruction_contents_and_generation_config() -> None:
    req = parse(
        {
            "systemInstruction": {"parts": [{"text": "Be brief."}, {"text": "Be kind."}]},
            "contents": [{"role": "user", "parts": [{"text": "a"}, {"text": "b"}]}],
            "generationConfig": {
                "temperature": 0.1,
                "topP": 0.5,
                "topK": 20,
                "maxOutputTokens": 77,
                "stopSequences": ["STOP"],
                "candidateCount": 1,
            },
        }
    )
    assert req.chat["messages"] == [
        {"role": "system", "content": "Be brief.\nBe kind."},
        {"role": "user", "content": "a\nb"},
    ]
    assert (req.chat["temperature"], req.chat["top_p"], req.chat["top_k"], req.chat["max_tokens"]) == (
        0.1,
        0.5,
        20,
        77,
    )
    assert req.chat["stop"] == ["STOP"] and req.client_model == "gemini-2.5-flash"


def test_snake_case_fields_read_too() -> None:
    req = parse(
        {
            "system_instruction": {"parts": [{"text": "S"}]},
            "contents": [{"role": "user", "parts": [{"text": "u"}]}],
            "generation_config": {"max_output_tokens": 9},
        }
    )
    assert req.chat["messages"][0] == {"role": "system", "content": "S"} and req.chat["max_tokens"] == 9


def test_candidate_count_above_one_refused() -> None:
    with pytest.raises(DialectError) as err:
        parse(
            {
                "contents": [{"role": "user", "parts": [{"text": "x"}]}],
                "generationConfig": {"candidateCount": 2},
            }
        )
    assert err.value.status == 400
    assert DIALECT.error_body(400, err.value.message, err.value.kind)["error"]["status"] == "INVALID_ARGUMENT"


def test_inline_image_refused() -> None:
    with pytest.raises(DialectError) as err:
        parse(
            {
                "contents": [
                    {"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": "AA"}}]}
                ]
            }
        )
    assert "text-only" in err.value.message


def test_function_declarations_with_openapi_types_become_json_schema() -> None:
    req = parse(
        {
            "contents": [{"role": "user", "parts": [{"text": "x"}]}],
            "tools": [
                {
                    "functionDeclarations": [
                        {
                            "name": "run",
                            "description": "Run",
                            "parameters": {
                                "type": "OBJECT",
                                "properties": {
                                    "cmd": {"type": "STRING"},
                                    "args": {"type": "ARRAY", "items": {"type": "STRING"}},
                                },
                                "required": ["cmd"],
                            },
                        },
                        {"name": "read", "parametersJsonSchema": {"type": "object", "properties": {}}},
                    ]
                },
                {"googleSearch": {}},
            ],
            "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
        }
    )
    assert req.chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "run",
                "description": "Run",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "cmd": {"type": "string"},
                        "args": {"type": "array", "items": {"type": "string"}},
                    },
                    "required": ["cmd"],
                },
            },
        },
        {
            "type": "function",
            "function": {"name": "read", "parameters": {"type": "object", "properties": {}}},
        },
    ]
    assert req.chat["tool_choice"] == "required"


def test_built_in_tools_dropped_and_listed_in_camel_case() -> None:
    req = parse(
        {
            "contents": [{"role": "user", "parts": [{"text": "x"}]}],
            "tools": [
                {"googleSearch": {}},
                {"code_execution": {}},
                {"functionDeclarations": [{"name": "run"}], "urlContext": {}},
            ],
        }
    )
    assert [t["function"]["name"] for t in req.chat["tools"]] == ["run"]
    assert req.context["dropped_tools"] == ["googleSearch", "codeExecution", "urlContext"]


@pytest.mark.parametrize(
    "path, query, fmt",
    [
        ("/v1beta/models/g:streamGenerateContent", {}, "json_array"),
        ("/v1beta/models/g:STREAMGENERATECONTENT", {"alt": "json"}, "json_array"),
        ("/v1beta/models/g:streamGenerateContent", {"alt": "sse"}, None),
        ("/v1beta/models/g:streamGenerateContent", {"Alt": "SSE"}, None),
        ("/v1beta/models/g:generateContent", {}, None),
    ],
)
def test_stream_without_alt_sse_is_the_json_array_form(path, query, fmt) -> None:
    req = parse({"contents": [{"role": "user", "parts": [{"text": "x"}]}]}, path, query)
    assert req.context.get("stream_format") == fmt


def test_function_call_history_gets_positional_ids_and_links_responses() -> None:
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "list"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "thinking...", "thought": True},
                    {"text": "Listing."},
                    {"functionCall": {"name": "run", "args": {"cmd": "ls"}}},
                ],
            },
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": "run", "response": {"output": "a.txt"}}}],
            },
            {"role": "model", "parts": [{"functionCall": {"name": "run", "args": {"cmd": "cat a.txt"}}}]},
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "run", "response": {"output": "hi"}}},
                    {"text": "thanks"},
                ],
            },
        ]
    }
    req = parse(body)
    assert req.chat["messages"] == [
        {"role": "user", "content": "list"},
        {
            "role": "assistant",
            "content": "Listing.",
            "reasoning_content": "thinking...",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "run", "arguments": '{"cmd": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": '{"output": "a.txt"}'},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "run", "arguments": '{"cmd": "cat a.txt"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"output": "hi"}'},
        {"role": "user", "content": "thanks"},
    ]
    assert req.context["call_base"] == 2
    assert parse(json.loads(json.dumps(body))).chat == req.chat


def test_reply_call_ids_continue_the_conversation_numbering(tool_reply) -> None:
    """A reply's call gets the id the next request assigns it, echoed by the client or not."""
    history = [{"role": "user", "parts": [{"text": "go"}]}]
    req = parse({"contents": history})
    body = DIALECT.render(tool_reply([("run", '{"cmd":"ls"}')]), req)
    call = body["candidates"][0]["content"]["parts"][0]["functionCall"]
    assert call == {"id": "call_0", "name": "run", "args": {"cmd": "ls"}}
    for echoed in (call, {"name": call["name"], "args": call["args"]}):
        follow = parse(
            {
                "contents": [
                    *history,
                    {"role": "model", "parts": [{"functionCall": echoed}]},
                    {"role": "user", "parts": [{"functionResponse": {"name": "run", "response": {"o": 1}}}]},
                ]
            }
        )
        assert follow.chat["messages"][1]["tool_calls"][0] == {
            "id": "call_0",
            "type": "function",
            "function": {"name": "run", "arguments": '{"cmd":"ls"}'},
        }
        assert follow.chat["messages"][2]["tool_call_id"] == "call_0"


def test_reply_parses_with_usage_and_stop(basic_reply) -> None:
    body = DIALECT.render(basic_reply, parse({"contents": [{"role": "user", "parts": [{"text": "q"}]}]}))
    response = types.GenerateContentResponse.model_validate(body)
    assert response.text == "The capital of France is Paris."
    assert response.candidates[0].finish_reason == types.FinishReason.STOP
    usage = response.usage_metadata
    assert (usage.prompt_token_count, usage.candidates_token_count, usage.total_token_count) == (37, 8, 45)


def test_length_reply_is_max_tokens(length_reply) -> None:
    body = DIALECT.render(length_reply, parse({"contents": [{"role": "user", "parts": [{"text": "q"}]}]}))
    assert body["candidates"][0]["finishReason"] == "MAX_TOKENS"


def test_stream_writes_every_part_as_its_own_event(tool_reply) -> None:
    req = parse(
        {"contents": [{"role": "user", "parts": [{"text": "q"}]}]},
        "/v1beta/models/g:streamGenerateContent",
        {"alt": "sse"},
    )
    events = list(
        DIALECT.render_stream(
            tool_reply([("run", '{"cmd": "ls"}'), ("run", '{"cmd": "pwd"}')], text="Ok."), req
        )
    )
    assert all(e.event is None for e in events)
    chunks = [types.GenerateContentResponse.model_validate(e.data) for e in events]
    assert len(chunks) == 3
    assert chunks[0].text == "Ok."
    assert [c.function_calls[0].args for c in chunks[1:]] == [{"cmd": "ls"}, {"cmd": "pwd"}]
    assert [c.candidates[0].finish_reason for c in chunks] == [None, None, types.FinishReason.STOP]
    assert chunks[-1].usage_metadata.total_token_count == 45


def test_error_envelope_and_stream_error() -> None:
    assert DIALECT.error_body(401, "bad key", "authentication_error") == {
        "error": {"code": 401, "message": "bad key", "status": "UNAUTHENTICATED"}
    }
    events = list(DIALECT.stream_error(502, "down", "upstream_5xx"))
    assert events[0].data == {"error": {"code": 502, "message": "down", "status": "UNAVAILABLE"}}
