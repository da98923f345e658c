"""OpenAI Responses ⇄ chat translation (capture-cases A9, A10, A11, B13, B15, B17, B19)."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tapdeck.proxy.dialects import detect
from tapdeck.proxy.dialects.base import DialectError
from tapdeck.proxy.dialects.responses import DIALECT
from tapdeck.proxy.dialects.stored_responses import StoredResponses

EXECUTE = {
    "type": "function",
    "name": "execute",
    "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


def parse(body: dict):
    return DIALECT.parse(body, "/v1/responses", {})


def test_responses_path_detected_case_insensitively() -> None:
    assert detect("/v1/Responses").name == "responses"
    assert detect("/openai/v1/responses/").name == "responses"


def test_string_input_and_instructions() -> None:
    req = parse(
        {
            "model": "gpt-x",
            "instructions": "Be terse.",
            "input": "hello",
            "max_output_tokens": 50,
            "temperature": 0.3,
            "top_p": 0.8,
        }
    )
    assert req.chat["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "hello"},
    ]
    assert (req.chat["max_tokens"], req.chat["temperature"], req.chat["top_p"]) == (50, 0.3, 0.8)
    assert req.client_model == "gpt-x" and req.stream is False


def test_leading_developer_items_fold_into_one_system_message_and_later_ones_stay() -> None:
    req = parse(
        {
            "instructions": "Base.",
            "input": [
                {"role": "developer", "content": [{"type": "input_text", "text": "Dev rules."}]},
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
                },
                {"type": "message", "role": "system", "content": "Late system."},
            ],
        }
    )
    assert req.chat["messages"] == [
        {"role": "system", "content": "Base.\n\nDev rules."},
        {"role": "user", "content": "a\nb"},
        {"role": "system", "content": "Late system."},
    ]


def test_function_call_history_with_reasoning_merges_into_one_assistant_message() -> None:
    body = {
        "input": [
            {"role": "user", "content": "list"},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "Use ls."}],
            },
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "content": [{"type": "output_text", "text": "Listing.", "annotations": []}],
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_A",
                "name": "execute",
                "arguments": '{"command":"ls"}',
            },
            {"type": "function_call_output", "call_id": "call_A", "output": "a.txt"},
        ],
        "tools": [EXECUTE],
    }
    chat = parse(body).chat
    assert chat["messages"] == [
        {"role": "user", "content": "list"},
        {
            "role": "assistant",
            "content": "Listing.",
            "reasoning_content": "Use ls.",
            "tool_calls": [
                {
                    "id": "call_A",
                    "type": "function",
                    "function": {"name": "execute", "arguments": '{"command":"ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_A", "content": "a.txt"},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "execute",
                "description": "Run a shell command",
                "parameters": EXECUTE["parameters"],
            },
        }
    ]
    assert parse(json.loads(json.dumps(body))).chat == chat


def test_reply_items_re_sent_render_the_same_assistant_message(tool_reply) -> None:
    """What the proxy answered, sent back as history, becomes the engine's own message again."""
    req = parse({"input": "go", "tools": [EXECUTE]})
    reply = tool_reply([("execute", '{"command":"ls"}')], text="Listing.")
    body = DIALECT.render(reply, req)
    history = [
        {"role": "user", "content": "go"},
        *body["output"],
        {"type": "function_call_output", "call_id": body["output"][-1]["call_id"], "output": "a"},
    ]
    chat = parse({"input": history, "tools": [EXECUTE]}).chat
    original = reply["choices"][0]["message"]
    assert chat["messages"][1] == {
        "role": "assistant",
        "content": original["content"],
        "tool_calls": original["tool_calls"],
    }


def test_user_function_never_replayed_as_local_shell_call(tool_reply) -> None:
    req = parse({"input": "run ls", "tools": [EXECUTE]})
    for name in ("execute", "local_shell"):
        body = DIALECT.render(tool_reply([(name, '{"command": "ls"}')]), req)
        assert [i["type"] for i in body["output"]] == ["function_call"]
        assert body["output"][0]["name"] == name


def test_local_shell_replayed_only_when_declared(tool_reply) -> None:
    req = parse({"input": "run ls", "tools": [{"type": "local_shell"}]})
    assert req.chat["tools"][0]["function"]["name"] == "local_shell"
    body = DIALECT.render(tool_reply([("local_shell", '{"command": ["ls", "-l"], "workdir": "/app"}')]), req)
    item = body["output"][0]
    assert item["type"] == "local_shell_call"
    assert item["action"] == {"type": "exec", "command": ["ls", "-l"], "env": {}, "working_directory": "/app"}
    Response.model_validate(body)
    back = parse(
        {
            "input": [
                {"role": "user", "content": "run ls"},
                item,
                {"type": "local_shell_call_output", "call_id": item["call_id"], "output": "f"},
            ],
            "tools": [{"type": "local_shell"}],
        }
    ).chat
    assert json.loads(back["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {
        "command": ["ls", "-l"],
        "workdir": "/app",
    }


def test_custom_tool_round_trip(tool_reply) -> None:
    req = parse(
        {"input": "patch", "tools": [{"type": "custom", "name": "apply_patch", "description": "Patch"}]}
    )
    body = DIALECT.render(tool_reply([("apply_patch", '{"input": "*** Begin Patch"}')]), req)
    assert body["output"][0]["type"] == "custom_tool_call" and body["output"][0]["input"] == "*** Begin Patch"


def test_hosted_tools_dropped_and_listed() -> None:
    req = parse(
        {
            "input": "x",
            "tools": [
                {"type": "web_search"},
                EXECUTE,
                {"type": "file_search"},
                {"type": "code_interpreter", "container": {"type": "auto"}},
            ],
        }
    )
    assert [t["function"]["name"] for t in req.chat["tools"]] == ["execute"]
    assert req.context["dropped_tools"] == ["web_search", "file_search", "code_interpreter"]
    assert parse({"input": "x", "tools": [EXECUTE]}).context["dropped_tools"] == []


@pytest.mark.parametrize(
    "part",
    [
        {"type": "input_image", "image_url": "data:image/png;base64,AA"},
        {"type": "input_file", "file_id": "f"},
    ],
)
def test_image_input_refused_with_400(part) -> None:
    with pytest.raises(DialectError) as err:
        parse({"input": [{"role": "user", "content": [{"type": "input_text", "text": "see"}, part]}]})
    assert err.value.status == 400 and "text-only" in err.value.message
    assert DIALECT.error_body(400, err.value.message, err.value.kind, err.value.param)["error"]["param"]


def test_tool_choice_forcing_a_dropped_hosted_tool_is_a_400() -> None:
    tools = [EXECUTE, {"type": "web_search_preview"}]
    with pytest.raises(DialectError) as err:
        parse({"input": "x", "tools": tools, "tool_choice": {"type": "web_search_preview"}})
    assert err.value.status == 400 and err.value.param == "tool_choice"
    assert "'web_search_preview'" in err.value.message
    forced = parse({"input": "x", "tools": [{"type": "local_shell"}], "tool_choice": {"type": "local_shell"}})
    assert forced.chat["tool_choice"] == {"type": "function", "function": {"name": "local_shell"}}


def test_n_above_one_refused() -> None:
    with pytest.raises(DialectError):
        parse({"input": "x", "n": 2})


def test_previous_response_id_expands_to_every_earlier_input_and_output_in_order() -> None:
    stored = StoredResponses()
    first = {"instructions": "old rules", "input": "list files"}
    stored.remember(
        first,
        {
            "id": "resp_a",
            "output": [{"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"}],
        },
    )
    second = {
        "previous_response_id": "resp_a",
        "input": [{"type": "function_call_output", "call_id": "c1", "output": "a.txt"}],
    }
    stored.remember(
        second,
        {
            "id": "resp_b",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "a.txt"}],
                }
            ],
        },
    )
    body = stored.expand({"previous_response_id": "resp_b", "instructions": "new rules", "input": "thanks"})
    assert [item.get("type") for item in body["input"]] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
        "message",
    ]
    assert body["input"][-1] == {"type": "message", "role": "user", "content": "thanks"}
    chat = parse(body).chat
    # only the new instructions: OpenAI does not carry earlier ones over
    assert chat["messages"][0] == {"role": "system", "content": "new rules"}
    assert [m["role"] for m in chat["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert len(stored) == 2


def test_unknown_or_unstored_previous_response_is_a_400_naming_it() -> None:
    stored = StoredResponses()
    stored.remember({"input": "x", "store": False}, {"id": "resp_private", "output": []})
    for missing in ("resp_nope", "resp_private"):
        with pytest.raises(DialectError) as err:
            stored.expand({"previous_response_id": missing, "input": "y"})
        assert err.value.status == 400 and err.value.param == "previous_response_id"
        assert repr(missing) in err.value.message and "full conversation" in err.value.message


def test_json_schema_text_format_becomes_response_format() -> None:
    req = parse(
        {
            "input": "x",
            "text": {
                "format": {"type": "json_schema", "name": "r", "schema": {"type": "object"}, "strict": True}
            },
        }
    )
    assert req.chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "r", "schema": {"type": "object"}, "strict": True},
    }


def test_reply_body_parses_with_zero_filled_usage_details(basic_reply) -> None:
    req = parse({"model": "gpt-x", "input": "q"})
    body = DIALECT.render(basic_reply, req)
    response = Response.model_validate(body)
    assert response.output_text == "The capital of France is Paris."
    assert response.status == "completed" and response.model == "gpt-x"
    assert response.usage.input_tokens == 37 and response.usage.output_tokens == 8
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert response.usage.output_tokens_details.reasoning_tokens == 0


def test_length_reply_is_incomplete(length_reply) -> None:
    body = DIALECT.render(length_reply, parse({"input": "q"}))
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}


def test_reasoning_reply_becomes_reasoning_item(reasoning_reply) -> None:
    body = DIALECT.render(reasoning_reply, parse({"input": "q"}))
    assert body["output"][0]["type"] == "reasoning"
    assert body["output"][0]["content"] == [{"type": "reasoning_text", "text": "France's capital is Paris."}]
    Response.model_validate(body)


def test_stream_sequence_for_text_and_function_call(tool_reply) -> None:
    req = parse({"model": "m", "input": "q", "tools": [EXECUTE], "stream": True})
    assert req.stream
    events = list(DIALECT.render_stream(tool_reply([("execute", '{"command": "ls"}')], text="Ok."), req))
    names = [e.event for e in events]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.data["sequence_number"] for e in events] == list(range(len(events)))
    adapter = TypeAdapter(ResponseStreamEvent)
    for e in events:
        assert e.data["type"] == e.event
        adapter.validate_python(e.data)
    done = events[-1].data["response"]
    assert done["status"] == "completed" and done["usage"]["input_tokens_details"]["cached_tokens"] == 0
    assert events[9].data["delta"] == '{"command": "ls"}'


def test_stream_error_events_parse() -> None:
    events = list(DIALECT.stream_error(502, "engine down", "upstream_5xx"))
    assert [e.event for e in events] == ["error", "response.failed"]
    adapter = TypeAdapter(ResponseStreamEvent)
    for e in events:
        adapter.validate_python(e.data)
    body = DIALECT.error_body(401, "bad key", "authentication_error")
    assert body["error"]["message"] == "bad key" and body["error"]["code"] == "invalid_api_key"
