"""Content parts a dialect does not translate are never dropped silently (docs/capture.md).

A part that holds content (an unknown block, a server tool's result, a Google data field) is a 400
in the caller's own envelope naming its type and where it was, with nothing sent upstream; a part
that holds nothing an engine can read (Anthropic `redacted_thinking`, a Responses reasoning item of
`encrypted_content` alone, a Google part of a bare `thoughtSignature`) is left out with a
`part_dropped` finding on the turn; a message left with nothing is a 400, never a vanished turn
(an Anthropic user turn gone made the call an assistant prefill). Chat, the internal form, keeps
every part for the engine to render or refuse.

Every call goes through the real SDK (raw HTTP where the SDK refuses to build the body) and the
capture server in front of the scripted engine, which answers with recorded vLLM 0.32 bodies.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest
from google.genai import errors as genai_errors
from google.genai import types

from tests.support.agent_recordings import google_client
from tests.support.capture_server import CaptureServer
from tests.support.fake_vllm import FakeVllm
from tests.support.findings import rendered

REFUSED = "it is refused rather than dropped, so the model never answers without it"


def _anthropic(info: dict[str, Any]) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key=info["api_key"], base_url=info["base_urls"]["anthropic"], max_retries=0
    )


def _openai(info: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(api_key=info["api_key"], base_url=info["base_urls"]["openai"], max_retries=0)


def _dropped(capture: CaptureServer, session_id: str) -> list[str]:
    return [f for f in rendered(capture.turn(session_id, 0)["findings"]) if "part_dropped" in f]


def _google_post(info: dict[str, Any], body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{info['base_urls']['google']}/v1beta/models/gemini-x:generateContent",
        headers={"x-goog-api-key": info["api_key"]},
        json=body,
        timeout=30,
    )


# ---- Anthropic ----------------------------------------------------------------------------------

PREFILL_HISTORY = [{"role": "user", "content": "Look at this."}, {"role": "assistant", "content": "Sure, "}]

ANTHROPIC_UNKNOWN = [
    # The case: a user turn of unknown blocks vanished, and the call became a prefill.
    (
        [*PREFILL_HISTORY, {"role": "user", "content": [{"type": "x_widget", "payload": "the file"}]}],
        None,
        "messages[2].content[0]",
        "x_widget",
        "text and tool_result blocks from the user",
    ),
    (
        [
            {"role": "user", "content": "Search the web."},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "server_tool_use",
                        "id": "srvtoolu_1",
                        "name": "web_search",
                        "input": {"query": "q"},
                    },
                    {
                        "type": "web_search_tool_result",
                        "tool_use_id": "srvtoolu_1",
                        "content": [
                            {
                                "type": "web_search_result",
                                "url": "https://example.com",
                                "title": "t",
                                "encrypted_content": "e",
                            }
                        ],
                    },
                ],
            },
            {"role": "user", "content": "So?"},
        ],
        None,
        "messages[1].content[0]",
        "server_tool_use",
        "text, thinking, redacted_thinking and tool_use blocks from the assistant",
    ),
    (
        [
            {"role": "user", "content": "Find the tool."},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "search", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "tool_reference", "tool_name": "bash"}],
                    }
                ],
            },
        ],
        None,
        "messages[2].content[0].content[0]",
        "tool_reference",
        "text blocks in a tool_result",
    ),
    (
        [{"role": "user", "content": "hi"}],
        [{"type": "x_policy", "rules": ["be brief"]}],
        "system[0]",
        "x_policy",
        "text blocks in the system prompt",
    ),
]


@pytest.mark.parametrize(
    "messages, system, where, kind, translated",
    ANTHROPIC_UNKNOWN,
    ids=["user-turn", "server-tool", "tool-result", "system"],
)
def test_anthropic_unknown_block_is_a_400_naming_its_type_and_place(
    upstream: FakeVllm,
    capture: CaptureServer,
    messages: list[dict[str, Any]],
    system: list[dict[str, Any]] | None,
    where: str,
    kind: str,
    translated: str,
) -> None:
    client = _anthropic(capture.open_session())
    upstream.requests.clear()  # the engine's probe, when this test opens the module's first session
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model="claude-x",
            max_tokens=8,
            messages=messages,
            system=system if system is not None else anthropic.omit,
        )
    assert err.value.status_code == 400
    assert err.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"{where}: content of type {kind!r} is not supported here (tapdeck translates "
            f"{translated}); {REFUSED}",
        },
    }
    assert upstream.requests == []


def test_anthropic_redacted_thinking_is_left_out_with_a_finding(
    upstream: FakeVllm, capture: CaptureServer
) -> None:
    info = capture.open_session()
    message = _anthropic(info).messages.create(
        model="claude-x",
        max_tokens=8,
        messages=[
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [
                    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
                    {"type": "text", "text": "Paris."},
                ],
            },
            {"role": "user", "content": "And Italy?"},
        ],
    )
    assert message.stop_reason == "end_turn"
    assert upstream.requests[-1]["messages"][-2:] == [
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And Italy?"},
    ]
    assert _dropped(capture, info["id"]) == [
        "[WARN] part_dropped: left out of the prompt, holding nothing an engine can read: "
        "messages[1].content[0] redacted_thinking (encrypted reasoning)"
    ]


def test_anthropic_message_of_only_left_out_blocks_is_a_400_not_an_empty_turn(
    upstream: FakeVllm, capture: CaptureServer
) -> None:
    client = _anthropic(capture.open_session())
    upstream.requests.clear()
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model="claude-x",
            max_tokens=8,
            messages=[
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [{"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}],
                },
                {"role": "user", "content": "Go on."},
            ],
        )
    assert err.value.body["error"] == {
        "type": "invalid_request_error",
        "message": "messages[1]: tapdeck leaves out messages[1].content[0] redacted_thinking (encrypted "
        "reasoning), and nothing else is in the message: it would reach the model empty, so "
        "it is refused (send its content as text)",
    }
    assert upstream.requests == []


# ---- OpenAI Responses ---------------------------------------------------------------------------


def test_responses_unknown_content_part_is_a_400_naming_its_type_and_place(
    upstream: FakeVllm, capture: CaptureServer
) -> None:
    client = _openai(capture.open_session())
    upstream.requests.clear()
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(
            model="gpt-x",
            max_output_tokens=8,
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Read this:"},
                        {"type": "input_widget", "payload": "the file"},
                    ],
                }
            ],
        )
    assert err.value.status_code == 400
    assert err.value.body == {
        "message": f"input[0].content[1]: content of type 'input_widget' is not supported here (tapdeck "
        f"translates text and refusal parts); {REFUSED}",
        "type": "invalid_request_error",
        "param": "input[0].content[1]",
        "code": "invalid_request_error",
    }
    assert upstream.requests == []


def test_responses_instructions_that_are_not_text_are_a_400_not_ignored(
    upstream: FakeVllm, capture: CaptureServer
) -> None:
    client = _openai(capture.open_session())
    upstream.requests.clear()
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(
            model="gpt-x",
            max_output_tokens=8,
            input="q",
            instructions=[{"role": "developer", "content": "Be brief."}],
        )  # type: ignore[arg-type]
    assert (err.value.body["message"], err.value.param) == ("instructions must be a string", "instructions")
    assert upstream.requests == []


def test_responses_reasoning_of_encrypted_content_alone_is_left_out_with_a_finding(
    upstream: FakeVllm, capture: CaptureServer
) -> None:
    info = capture.open_session()
    response = _openai(info).responses.create(
        model="gpt-x",
        max_output_tokens=8,
        input=[
            {"role": "user", "content": "q"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAABo_opaque"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Paris."}]},
            {"role": "user", "content": "And Italy?"},
        ],
    )
    assert response.status == "completed"
    assert upstream.requests[-1]["messages"][-2:] == [
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And Italy?"},
    ]
    assert _dropped(capture, info["id"]) == [
        "[WARN] part_dropped: left out of the prompt, holding nothing an engine can read: "
        "input[1] reasoning (encrypted_content only)"
    ]


# ---- Google generateContent --------------------------------------------------------------------

GOOGLE_HISTORY = [
    {"role": "user", "parts": [{"text": "Look at this."}]},
    {"role": "model", "parts": [{"text": "Sure."}]},
]

GOOGLE_UNKNOWN = [
    (
        {"contents": [*GOOGLE_HISTORY, {"role": "user", "parts": [{"widget": {"payload": "the file"}}]}]},
        "contents[2].parts[0]",
        "widget",
        "text, functionCall and functionResponse parts",
    ),
    (
        {
            "contents": [
                *GOOGLE_HISTORY,
                {
                    "role": "user",
                    "parts": [
                        {"text": "Run it:"},
                        {"executableCode": {"language": "PYTHON", "code": "print(1)"}},
                    ],
                },
            ]
        },
        "contents[2].parts[1]",
        "executableCode",
        "text, functionCall and functionResponse parts",
    ),
    (
        {
            "contents": [
                *GOOGLE_HISTORY,
                {"role": "user", "parts": [{"functionCall": {"name": "run", "args": {}}}]},
            ]
        },
        "contents[2].parts[0]",
        "functionCall",
        "text and functionResponse parts there",
    ),
    (
        {
            "contents": GOOGLE_HISTORY[:1],
            "systemInstruction": {"parts": [{"text": "Be brief."}, {"widget": {"rules": 1}}]},
        },
        "systemInstruction.parts[1]",
        "widget",
        "text, functionCall and functionResponse parts",
    ),
]


@pytest.mark.parametrize(
    "body, where, kind, translated",
    GOOGLE_UNKNOWN,
    ids=["user-turn", "data-field", "misplaced-call", "system"],
)
def test_google_unknown_part_is_a_400_naming_its_field_and_place(
    upstream: FakeVllm, capture: CaptureServer, body: dict[str, Any], where: str, kind: str, translated: str
) -> None:
    # Raw HTTP: google-genai refuses to build a part with a field its types do not have.
    info = capture.open_session()
    upstream.requests.clear()
    reply = _google_post(info, body)
    assert reply.status_code == 400
    assert reply.json() == {
        "error": {
            "code": 400,
            "status": "INVALID_ARGUMENT",
            "message": f"{where}: content of type {kind!r} is not supported here (tapdeck translates "
            f"{translated}); {REFUSED}",
        }
    }
    assert upstream.requests == []


def test_google_sdk_code_execution_part_is_a_400_the_sdk_raises(
    upstream: FakeVllm, capture: CaptureServer
) -> None:
    client = google_client(capture.open_session())
    upstream.requests.clear()
    contents = [
        types.Content(role="user", parts=[types.Part(text="q")]),
        types.Content(
            role="model",
            parts=[
                types.Part(code_execution_result=types.CodeExecutionResult(outcome="OUTCOME_OK", output="42"))
            ],
        ),
    ]
    with pytest.raises(genai_errors.ClientError) as err:
        client.models.generate_content(
            model="gemini-x", contents=contents, config=types.GenerateContentConfig(max_output_tokens=8)
        )
    assert (err.value.code, err.value.status) == (400, "INVALID_ARGUMENT")
    assert err.value.message == (
        "contents[1].parts[0]: content of type 'codeExecutionResult' is not "
        "supported here (tapdeck translates text, functionCall and "
        f"functionResponse parts); {REFUSED}"
    )
    assert upstream.requests == []


def test_google_part_of_a_bare_thought_signature_is_left_out_with_a_finding(
    upstream: FakeVllm, capture: CaptureServer
) -> None:
    info = capture.open_session()
    contents = [
        types.Content(role="user", parts=[types.Part(text="q")]),
        types.Content(
            role="model", parts=[types.Part(text="Paris."), types.Part(thought_signature=b"opaque-signature")]
        ),
        types.Content(role="user", parts=[types.Part(text="And Italy?")]),
    ]
    client = google_client(info)  # held: a collected Client closes its connection pool
    client.models.generate_content(
        model="gemini-x", contents=contents, config=types.GenerateContentConfig(max_output_tokens=8)
    )
    assert upstream.requests[-1]["messages"][-2:] == [
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And Italy?"},
    ]
    assert _dropped(capture, info["id"]) == [
        "[WARN] part_dropped: left out of the prompt, holding nothing an engine can read: "
        "contents[1].parts[1] thoughtSignature (a part with no text, call or response)"
    ]


def test_google_user_content_of_only_left_out_parts_is_a_400_not_a_vanished_turn(
    upstream: FakeVllm, capture: CaptureServer
) -> None:
    info = capture.open_session()
    upstream.requests.clear()
    reply = _google_post(info, {"contents": [*GOOGLE_HISTORY, {"role": "user", "parts": [{}]}]})
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == (
        "contents[2]: tapdeck leaves out contents[2].parts[0] (an empty part), and nothing else is in the "
        "message: it would reach the model empty, so it is refused (send its content as text)"
    )
    assert upstream.requests == []


# ---- OpenAI chat-completions (the internal form) -----------------------------------------------


def test_chat_keeps_every_part_for_the_engine_even_when_system_messages_merge(
    upstream: FakeVllm, capture: CaptureServer
) -> None:
    # Nothing is translated, so nothing is dropped: an unknown part reaches the engine, which
    # renders it or refuses it (vLLM and the embedded engine answer 400 naming it). Merging the
    # leading system messages into one used to drop a content that was neither text nor a list.
    widget = {"type": "x_widget", "payload": "the file"}
    _openai(capture.open_session()).chat.completions.create(
        model="m",
        max_tokens=8,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": widget},  # type: ignore[typeddict-item]
            {"role": "user", "content": [{"type": "text", "text": "Read this:"}, widget]},
        ],
    )  # type: ignore[list-item]
    assert upstream.requests[-1]["messages"] == [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}, widget]},
        {"role": "user", "content": [{"type": "text", "text": "Read this:"}, widget]},
    ]
