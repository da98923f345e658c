"""Real client SDKs (openai Responses, anthropic, google-genai) → the proxy → the embedded engine.

Each conversation is three calls whose history starts with a tool call and its result written by
the harness side (the tiny model does not call tools reliably), then grows by whatever the model
answered plus a tool result (if it called a tool) or a user follow-up. Captured: three turns, ONE
root, each later turn a child of the one before, token ids on every turn, the tool call and its
result linked by id in the normalised request. Parsed by the SDK: text, usage, stop reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from tapdeck.proxy.http.sse import KEEPALIVE_SECONDS
from tapdeck.proxy.upstream.tiers import EngineSpec
from tests.support.capture_server import CaptureServer, capture_server
from tests.support.fake_vllm import models_only_engine

pytestmark = pytest.mark.slow

SYSTEM = "You are a helpful assistant working in a shell. Answer briefly."
FIRST_QUESTION = "List the files in the current directory."
OBSERVATION = "notes.txt\nmain.py"
FOLLOW_UPS = ["Thanks. What does main.py probably contain?", "Good. Summarise in one sentence."]
MAX_TOKENS = 12
KEEPALIVE_S = 0.05


@pytest.fixture(scope="module")
def proxy(embedded_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CaptureServer]:
    # Keepalives every 50 ms: every streamed reply below has them interleaved (each SDK must cope).
    engine = EngineSpec(url=embedded_engine.base_url, model=embedded_engine.served_name)
    with capture_server(engine, tmp_path_factory.mktemp("capture"), keepalive_s=KEEPALIVE_S) as server:
        yield server


def assert_one_conversation(
    proxy: CaptureServer, session_id: str, *, tool_call_id: str
) -> list[dict[str, Any]]:
    """Three captured turns in one chain from one root, ids on each, the tool round trip linked."""
    summary = proxy.summary(session_id)
    assert summary["turns"] == 3, summary
    assert summary["roots"] == 1, summary
    turns = [proxy.turn(session_id, seq) for seq in range(3)]
    assert [t["parent"] for t in turns] == [None, 0, 1]
    for t in turns:
        assert t["prompt_len"] and t["prompt_len"] > 0
        assert t["sampled_ids"], t
        assert t["logprobs"] is not None and len(t["logprobs"]) == len(t["sampled_ids"])
    messages = turns[0]["request"]["messages"]
    assert messages[0] == {"role": "system", "content": SYSTEM}
    call = next(m for m in messages if m.get("tool_calls"))
    assert call["tool_calls"][0]["id"] == tool_call_id
    result = messages[messages.index(call) + 1]
    assert result["role"] == "tool" and result["tool_call_id"] == tool_call_id
    assert turns[0]["request"]["tools"][0]["type"] == "function"
    return turns


# ---- Anthropic ----------------------------------------------------------------------------------

ANTHROPIC_TOOLS = [
    {
        "name": "bash",
        "description": "Run a shell command and return its output.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
]


def _anthropic_history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": FIRST_QUESTION},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "I will run ls."},
                {"type": "tool_use", "id": "toolu_ls", "name": "bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_ls", "content": OBSERVATION}],
        },
    ]


def _anthropic_continue(messages: list[dict[str, Any]], message: anthropic.types.Message, turn: int) -> None:
    messages.append(
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]}
    )
    calls = [b for b in message.content if b.type == "tool_use"]
    if calls:
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": c.id, "content": OBSERVATION} for c in calls
                ],
            }
        )
    else:
        messages.append({"role": "user", "content": FOLLOW_UPS[min(turn, 1)]})


@pytest.mark.parametrize("streaming", [False, True], ids=["json", "sse"])
def test_anthropic_sdk_three_turn_tool_conversation_is_one_root(
    proxy: CaptureServer, streaming: bool
) -> None:
    info = proxy.open_session()
    assert info["tier"] == "tokens"
    client = anthropic.Anthropic(
        api_key=info["api_key"], base_url=info["base_urls"]["anthropic"], max_retries=0
    )
    messages = _anthropic_history()
    for turn in range(3):
        # This SDK release has no sampling keywords; the API still takes them in the body.
        kwargs = dict(
            model="claude-test",
            max_tokens=MAX_TOKENS,
            extra_body={"temperature": 0},
            system=[{"type": "text", "text": SYSTEM}],
            tools=ANTHROPIC_TOOLS,
            messages=messages,
        )
        if streaming:
            with client.messages.stream(**kwargs) as stream:
                kinds = [event.type for event in stream]
                message = stream.get_final_message()
            assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        else:
            message = client.messages.create(**kwargs)
        assert message.model == "claude-test"
        assert message.stop_reason in ("end_turn", "max_tokens", "tool_use")
        assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
        if message.stop_reason != "tool_use":
            assert message.content and message.content[0].type == "text"
        _anthropic_continue(messages, message, turn)
    turns = assert_one_conversation(proxy, info["id"], tool_call_id="toolu_ls")
    assert turns[0]["meta"]["dialect"] == "anthropic"


def test_anthropic_count_tokens_is_not_a_turn(proxy: CaptureServer) -> None:
    info = proxy.open_session()
    client = anthropic.Anthropic(
        api_key=info["api_key"], base_url=info["base_urls"]["anthropic"], max_retries=0
    )
    count = client.messages.count_tokens(
        model="claude-test", system=SYSTEM, messages=_anthropic_history(), tools=ANTHROPIC_TOOLS
    )
    assert count.input_tokens > 20
    assert proxy.summary(info["id"])["turns"] == 0


def test_anthropic_unknown_key_401_and_image_400_in_anthropic_envelope(proxy: CaptureServer) -> None:
    info = proxy.open_session()
    bad = anthropic.Anthropic(
        api_key="sk-not-a-session", base_url=info["base_urls"]["anthropic"], max_retries=0
    )
    with pytest.raises(anthropic.AuthenticationError) as err:
        bad.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    good = anthropic.Anthropic(
        api_key=info["api_key"], base_url=info["base_urls"]["anthropic"], max_retries=0
    )
    with pytest.raises(anthropic.BadRequestError) as err:
        good.messages.create(
            model="m",
            max_tokens=5,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                        }
                    ],
                }
            ],
        )
    assert "text-only" in err.value.body["error"]["message"]


# ---- OpenAI Responses ---------------------------------------------------------------------------

EXECUTE = {
    "type": "function",
    "name": "execute",
    "description": "Run a shell command and return its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


def _responses_history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": FIRST_QUESTION},
        {"type": "function_call", "call_id": "call_ls", "name": "execute", "arguments": '{"command": "ls"}'},
        {"type": "function_call_output", "call_id": "call_ls", "output": OBSERVATION},
    ]


@pytest.mark.parametrize("streaming", [False, True], ids=["json", "sse"])
def test_openai_responses_sdk_three_turn_tool_conversation_is_one_root(
    proxy: CaptureServer, streaming: bool
) -> None:
    info = proxy.open_session()
    client = openai.OpenAI(api_key=info["api_key"], base_url=info["base_urls"]["openai"], max_retries=0)
    items = _responses_history()
    for turn in range(3):
        kwargs = dict(
            model="gpt-test",
            instructions=SYSTEM,
            input=items,
            tools=[EXECUTE],
            max_output_tokens=MAX_TOKENS,
            temperature=0,
        )
        if streaming:
            events = list(client.responses.create(stream=True, **kwargs))
            kinds = [e.type for e in events]
            assert kinds[:2] == ["response.created", "response.in_progress"]
            assert [e.sequence_number for e in events] == list(range(len(events)))
            response = events[-1].response
            # A length-cut reply ends with response.incomplete, as OpenAI's does.
            assert kinds[-1] == f"response.{response.status}"
        else:
            response = client.responses.create(**kwargs)
        assert response.model == "gpt-test" and response.status in ("completed", "incomplete")
        usage = response.usage
        assert usage.input_tokens > 0 and usage.output_tokens > 0
        assert usage.input_tokens_details.cached_tokens == 0
        assert usage.output_tokens_details.reasoning_tokens == 0
        assert all(item.type in ("message", "function_call") for item in response.output)
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            assert isinstance(response.output_text, str)
        items.extend(item.model_dump(exclude_none=True) for item in response.output)
        if calls:
            items.extend(
                {"type": "function_call_output", "call_id": c.call_id, "output": OBSERVATION} for c in calls
            )
        else:
            items.append({"role": "user", "content": FOLLOW_UPS[min(turn, 1)]})
    turns = assert_one_conversation(proxy, info["id"], tool_call_id="call_ls")
    assert turns[0]["meta"]["dialect"] == "responses"


@pytest.mark.parametrize("streaming", [False, True], ids=["json", "sse"])
def test_openai_responses_sdk_chained_by_previous_response_id_is_one_root(
    proxy: CaptureServer, streaming: bool
) -> None:
    info = proxy.open_session()
    client = openai.OpenAI(api_key=info["api_key"], base_url=info["base_urls"]["openai"], max_retries=0)
    new_items, previous = _responses_history(), None
    for turn in range(3):
        kwargs = dict(
            model="gpt-test",
            instructions=SYSTEM,
            input=new_items,
            tools=[EXECUTE],
            max_output_tokens=MAX_TOKENS,
            temperature=0,
        )
        if previous is not None:
            kwargs["previous_response_id"] = previous
        if streaming:
            response = list(client.responses.create(stream=True, **kwargs))[-1].response
        else:
            response = client.responses.create(**kwargs)
        assert response.previous_response_id == previous and response.store is True
        previous = response.id
        calls = [item for item in response.output if item.type == "function_call"]
        new_items = [
            {"type": "function_call_output", "call_id": c.call_id, "output": OBSERVATION} for c in calls
        ] or [{"role": "user", "content": FOLLOW_UPS[min(turn, 1)]}]
    assert_one_conversation(proxy, info["id"], tool_call_id="call_ls")
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="gpt-test", input="hi", previous_response_id="resp_unknown")
    assert "'resp_unknown' is not known to this session" in err.value.message


def test_openai_responses_unknown_key_401(proxy: CaptureServer) -> None:
    bad = openai.OpenAI(api_key="sk-not-a-session", base_url=f"{proxy.url}/v1", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        bad.responses.create(model="m", input="hi")
    assert err.value.status_code == 401 and "session key" in err.value.message


# ---- Google -------------------------------------------------------------------------------------

RUN = types.Tool(
    function_declarations=[
        types.FunctionDeclaration(
            name="run",
            description="Run a shell command and return its output.",
            parameters=types.Schema(
                type="OBJECT", properties={"command": types.Schema(type="STRING")}, required=["command"]
            ),
        )
    ]
)


def _google_history() -> list[types.Content]:
    return [
        types.Content(role="user", parts=[types.Part(text=FIRST_QUESTION)]),
        types.Content(
            role="model",
            parts=[types.Part(function_call=types.FunctionCall(name="run", args={"command": "ls"}))],
        ),
        types.Content(
            role="user",
            parts=[
                types.Part(
                    function_response=types.FunctionResponse(name="run", response={"output": OBSERVATION})
                )
            ],
        ),
    ]


def _google_client(info: dict[str, Any], key: str | None = None) -> genai.Client:
    return genai.Client(
        api_key=key or info["api_key"], http_options=types.HttpOptions(base_url=info["base_urls"]["google"])
    )


@pytest.mark.parametrize("streaming", [False, True], ids=["json", "sse"])
def test_google_genai_sdk_three_turn_tool_conversation_is_one_root(
    proxy: CaptureServer, streaming: bool
) -> None:
    info = proxy.open_session()
    client = _google_client(info)
    contents = _google_history()
    config = types.GenerateContentConfig(
        system_instruction=SYSTEM,
        tools=[RUN],
        temperature=0,
        max_output_tokens=MAX_TOKENS,
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    for turn in range(3):
        if streaming:
            chunks = list(
                client.models.generate_content_stream(model="gemini-test", contents=contents, config=config)
            )
            assert chunks and chunks[-1].candidates[0].finish_reason is not None
            parts = [p for c in chunks for p in (c.candidates[0].content.parts or [])]
            usage = chunks[-1].usage_metadata
            finish = chunks[-1].candidates[0].finish_reason
            calls = [p.function_call for p in parts if p.function_call]
        else:
            response = client.models.generate_content(model="gemini-test", contents=contents, config=config)
            parts = response.candidates[0].content.parts
            usage = response.usage_metadata
            finish = response.candidates[0].finish_reason
            calls = response.function_calls or []
            assert response.model_version == "gemini-test"
        assert finish in (types.FinishReason.STOP, types.FinishReason.MAX_TOKENS)
        assert usage.prompt_token_count > 0 and usage.candidates_token_count > 0
        assert usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count
        contents.append(types.Content(role="model", parts=parts))
        if calls:
            contents.append(
                types.Content(
                    role="user",
                    parts=[
                        types.Part(
                            function_response=types.FunctionResponse(
                                id=c.id, name=c.name, response={"output": OBSERVATION}
                            )
                        )
                        for c in calls
                    ],
                )
            )
        else:
            contents.append(types.Content(role="user", parts=[types.Part(text=FOLLOW_UPS[min(turn, 1)])]))
    turns = assert_one_conversation(proxy, info["id"], tool_call_id="call_0")
    assert turns[0]["meta"]["dialect"] == "google"


def test_google_count_tokens_is_not_a_turn(proxy: CaptureServer) -> None:
    info = proxy.open_session()
    client = _google_client(info)
    count = client.models.count_tokens(model="gemini-test", contents=_google_history())
    assert count.total_tokens > 10
    assert proxy.summary(info["id"])["turns"] == 0


def test_google_key_in_query_and_unknown_key_401(proxy: CaptureServer) -> None:
    info = proxy.open_session()
    body = {
        "contents": [{"role": "user", "parts": [{"text": "Say hi."}]}],
        "generationConfig": {"maxOutputTokens": 4, "temperature": 0},
    }
    path = "/v1beta/models/gemini-test:generateContent"
    ok = httpx.post(f"{proxy.url}{path}", params={"key": info["api_key"]}, json=body, timeout=60)
    assert ok.status_code == 200 and ok.json()["candidates"][0]["content"]["role"] == "model"
    denied = httpx.post(f"{proxy.url}{path}", params={"key": "not-a-session"}, json=body, timeout=60)
    assert denied.status_code == 401
    assert denied.json()["error"]["status"] == "UNAUTHENTICATED"
    bad = _google_client(info, key="not-a-session")
    with pytest.raises(genai_errors.ClientError) as err:
        bad.models.generate_content(model="gemini-test", contents="hi")
    assert err.value.code == 401
    stream = httpx.post(
        f"{proxy.url}/v1beta/models/gemini-test:streamGenerateContent",
        params={"alt": "sse"},
        headers={"x-goog-api-key": info["api_key"]},
        json=body,
        timeout=60,
    )
    events = [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: ")]
    assert stream.headers["content-type"].startswith("text/event-stream")
    assert events and events[-1]["candidates"][0]["finishReason"] in ("STOP", "MAX_TOKENS")
    assert proxy.summary(info["id"])["turns"] == 2


def test_google_candidate_count_refused_in_google_envelope(proxy: CaptureServer) -> None:
    client = _google_client(proxy.open_session())
    with pytest.raises(genai_errors.ClientError) as err:
        client.models.generate_content(
            model="gemini-test", contents="hi", config=types.GenerateContentConfig(candidate_count=2)
        )
    assert err.value.code == 400 and err.value.status == "INVALID_ARGUMENT"


# ---- engine failures while streaming: SSE errors in each dialect (B15) --------------------------


@pytest.fixture
def held_proxy(embedded_engine: Any, tmp_path: Path) -> Iterator[CaptureServer]:
    """A capture server holding a stream's start as long as by default (10 s): the engine client
    retries a refused connection for ~0.2 s before it calls the engine unreachable, longer than the
    50 ms hold of `proxy`."""
    engine = EngineSpec(url=embedded_engine.base_url, model=embedded_engine.served_name)
    with capture_server(engine, tmp_path / "capture", keepalive_s=KEEPALIVE_SECONDS) as server:
        yield server


@pytest.fixture
def dead_engine_session(held_proxy: CaptureServer) -> dict[str, Any]:
    """A session whose engine went away once it opened: every call fails upstream (502, unreachable)."""
    with models_only_engine() as engine:
        reply = held_proxy.admin.post("/admin/sessions", json={"engine": {"url": engine}})
    reply.raise_for_status()
    return reply.json()


def test_stream_failures_before_the_start_keep_their_status_in_each_dialect(
    held_proxy: CaptureServer, dead_engine_session: dict[str, Any]
) -> None:
    # The stream is held until the engine answers, so a dead engine is a 502 each SDK retries on
    # (issue 17), in each dialect's own error envelope.
    info = dead_engine_session
    ant = anthropic.Anthropic(api_key=info["api_key"], base_url=info["base_urls"]["anthropic"], max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as err:
        with ant.messages.stream(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            list(stream)
    assert err.value.status_code == 502 and err.value.body["type"] == "error"

    oai = openai.OpenAI(api_key=info["api_key"], base_url=info["base_urls"]["openai"], max_retries=0)
    with pytest.raises(openai.InternalServerError) as oerr:
        list(oai.responses.create(model="m", input="hi", stream=True))
    assert oerr.value.status_code == 502 and oerr.value.body["code"] == "server_error"

    raw = httpx.post(
        f"{held_proxy.url}/v1beta/models/g:streamGenerateContent?alt=sse",
        headers={"x-goog-api-key": info["api_key"]},
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        timeout=60,
    )
    assert raw.status_code == 502 and raw.json()["error"]["status"] == "UNAVAILABLE"
    goo = _google_client(info)
    with pytest.raises(genai_errors.ServerError) as gerr:
        list(goo.models.generate_content_stream(model="g", contents="hi"))
    assert gerr.value.code == 502
