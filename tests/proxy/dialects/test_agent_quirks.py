"""The six seed agents' request shapes, replayed through the SDK each agent bundles, against the
capture server in front of a recorded-vLLM engine (tests/proxy/dialects/recordings: shapes written after
shared/reference/harness-clis.md).

Pinned here (issue 17 and issue 11's quirk list): engine errors reach each SDK with their real
status, streaming or not; truncation in each dialect's own terms; codex's `namespace` tools
flattened for the engine and mapped back; JSON-mode side calls served with JSON and marked
auxiliary; capped `max_tokens` visible; mid-conversation system messages left in place (or folded,
with a finding, when the engine's template refuses them); one access-log line per call.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google.genai import errors as genai_errors
from google.genai import types

from tests.support.agent_recordings import gemini_router, google_client, recording
from tests.support.capture_server import SCRIPTED_KEEPALIVE_S, CaptureServer
from tests.support.fake_vllm import FakeVllm, models_only_engine
from tests.support.findings import rendered
from tests.support.vllm_recordings import vllm_error, vllm_fixture

DIALECTS = ["chat", "responses", "anthropic", "google"]
STREAMING = pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])


def recorded_reply(name: str = "chat_basic") -> dict[str, Any]:
    return copy.deepcopy(vllm_fixture(name)["response"])


def tool_reply(name: str, arguments: str) -> dict[str, Any]:
    """The recorded reply with its message turned into a tool call the way vLLM's parser does."""
    reply = recorded_reply()
    choice = reply["choices"][0]
    choice["message"]["content"] = None
    choice["message"]["tool_calls"] = [
        {"id": "chatcmpl-tool-0abc", "type": "function", "function": {"name": name, "arguments": arguments}}
    ]
    choice["finish_reason"] = "tool_calls"
    return reply


def answer_with(reply: dict[str, Any]) -> Any:
    return lambda body: (200, _shaped(body, reply))


def _shaped(body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    from tests.support.vllm_recordings import vllm_reply_to

    return vllm_reply_to(body, reply)


# ---- the SDK each agent bundles ---------------------------------------------------------------


def openai_client(info: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(api_key=info["api_key"], base_url=info["base_urls"]["openai"], max_retries=0)


def anthropic_client(info: dict[str, Any], *, bearer: bool = False) -> anthropic.Anthropic:
    if bearer:  # qwen-code's Anthropic mode: Authorization: Bearer, no x-api-key
        return anthropic.Anthropic(
            api_key=None, auth_token=info["api_key"], base_url=info["base_urls"]["anthropic"], max_retries=0
        )
    return anthropic.Anthropic(
        api_key=info["api_key"], base_url=info["base_urls"]["anthropic"], max_retries=0
    )


def call(dialect: str, info: dict[str, Any], *, stream: bool, max_tokens: int = 16) -> dict[str, Any]:
    """One short call in `dialect` through its SDK; what the SDK parsed, in a common form
    (`finish`, `text`, plus the dialect's own fields). SDK errors propagate."""
    if dialect == "chat":
        client = openai_client(info)
        kwargs = dict(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens)
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kwargs))
            finish = next(
                c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
            )
            return {"finish": finish}
        return {"finish": client.chat.completions.create(**kwargs).choices[0].finish_reason}
    if dialect == "responses":
        client = openai_client(info)
        kwargs = dict(model="m", input="hi", max_output_tokens=max_tokens)
        if stream:
            events = list(client.responses.create(stream=True, **kwargs))
            return {
                "finish": events[-1].response.status,
                "last_event": events[-1].type,
                "incomplete": events[-1].response.incomplete_details,
            }
        response = client.responses.create(**kwargs)
        return {"finish": response.status, "incomplete": response.incomplete_details}
    if dialect == "anthropic":
        client = anthropic_client(info)
        kwargs = dict(model="claude-x", max_tokens=max_tokens, messages=[{"role": "user", "content": "hi"}])
        if stream:
            with client.messages.stream(**kwargs) as events:
                return {"finish": events.get_final_message().stop_reason}
        return {"finish": client.messages.create(**kwargs).stop_reason}
    client = google_client(info)
    config = types.GenerateContentConfig(max_output_tokens=max_tokens)
    if stream:
        chunks = list(client.models.generate_content_stream(model="g", contents="hi", config=config))
        return {"finish": chunks[-1].candidates[0].finish_reason}
    return {
        "finish": client.models.generate_content(model="g", contents="hi", config=config)
        .candidates[0]
        .finish_reason
    }


def sdk_status(exc: BaseException) -> int:
    """The HTTP status an SDK error carries (what the agent's retry logic reads)."""
    if isinstance(exc, (openai.APIStatusError, anthropic.APIStatusError)):
        return exc.status_code
    if isinstance(exc, genai_errors.APIError):
        return exc.code
    raise AssertionError(f"not an SDK status error: {exc!r}")


SDK_ERRORS = (openai.APIError, anthropic.APIError, genai_errors.APIError)


# ---- 1 + 2: engine errors keep their status ----------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
@STREAMING
@pytest.mark.parametrize("engine_status, agent_status", [(400, 400), (500, 502)], ids=["400", "500"])
def test_engine_error_reaches_each_sdk_with_its_real_status(
    capture: CaptureServer,
    upstream: FakeVllm,
    dialect: str,
    stream: bool,
    engine_status: int,
    agent_status: int,
) -> None:
    info = capture.open_session()
    upstream.answer = lambda body: (engine_status, vllm_error(engine_status, "the engine refused this"))
    with pytest.raises(SDK_ERRORS) as raised:
        call(dialect, info, stream=stream)
    assert sdk_status(raised.value) == agent_status


@pytest.mark.parametrize("dialect", DIALECTS)
def test_dead_engine_gives_each_streaming_sdk_a_retryable_5xx_and_a_session_finding(
    capture: CaptureServer, dialect: str
) -> None:
    with models_only_engine() as engine:  # settles the address, then is gone: every call fails
        reply = capture.admin.post("/admin/sessions", json={"engine": {"url": engine, "model": "m"}})
    reply.raise_for_status()
    info = reply.json()
    with pytest.raises(SDK_ERRORS) as raised:
        call(dialect, info, stream=True)
    assert sdk_status(raised.value) == 502
    findings = rendered(capture.summary(info["id"])["findings"])
    assert any(f.startswith("[WARN] engine_unreachable: unreachable") for f in findings), findings


@pytest.mark.medium
def test_responses_error_after_the_stream_started_ends_in_response_failed(
    capture: CaptureServer, upstream: FakeVllm
) -> None:
    # As OpenAI sends it: an `error` event, then `response.failed` (codex retries on it).
    info = capture.open_session()
    upstream.delay = SCRIPTED_KEEPALIVE_S + 1.0  # past the hold: the stream has started (HTTP 200)
    upstream.answer = lambda body: (500, vllm_error(500, "engine core died", "InternalServerError"))
    events = list(openai_client(info).responses.create(model="m", input="hi", stream=True))
    assert [e.type for e in events] == ["error", "response.failed"]
    assert events[-1].response.error.code == "server_error"


@pytest.mark.medium
@pytest.mark.parametrize("dialect", ["chat", "anthropic", "google"])
def test_engine_error_after_the_stream_started_is_raised_by_each_sdk(
    capture: CaptureServer, upstream: FakeVllm, dialect: str
) -> None:
    info = capture.open_session()
    upstream.delay = SCRIPTED_KEEPALIVE_S + 1.0  # past the hold: the stream has started (HTTP 200)
    upstream.answer = lambda body: (500, vllm_error(500, "engine core died", "InternalServerError"))
    with pytest.raises(SDK_ERRORS) as raised:
        call(dialect, info, stream=True)
    if dialect == "google":
        # The bare {"error": ...} chunk: google-genai raises with the error's own code.
        assert sdk_status(raised.value) == 502
    assert "engine" in str(raised.value)


@pytest.mark.medium
def test_google_stream_error_after_start_is_a_bare_error_chunk(
    capture: CaptureServer, upstream: FakeVllm
) -> None:
    info = capture.open_session()
    upstream.delay = SCRIPTED_KEEPALIVE_S + 1.0
    upstream.answer = lambda body: (500, vllm_error(500, "engine core died", "InternalServerError"))
    reply = httpx.post(
        f"{capture.url}/v1beta/models/g:streamGenerateContent?alt=sse",
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        headers={"x-goog-api-key": info["api_key"]},
        timeout=30,
    )
    assert reply.status_code == 200
    lines = [line for line in reply.text.split("\n") if line.strip()]
    assert lines and not lines[-1].startswith("data:")
    assert json.loads(lines[-1])["error"]["code"] == 502


# ---- 3: truncation, each dialect its own way -----------------------------------------------------


@pytest.mark.parametrize(
    "dialect, expected",
    [
        ("chat", "length"),
        ("responses", "incomplete"),
        ("anthropic", "max_tokens"),
        ("google", types.FinishReason.MAX_TOKENS),
    ],
)
@STREAMING
def test_length_cut_reply_is_truncation_in_each_dialect(
    capture: CaptureServer, upstream: FakeVllm, dialect: str, expected: Any, stream: bool
) -> None:
    info = capture.open_session()
    upstream.answer = answer_with(recorded_reply("chat_length"))
    got = call(dialect, info, stream=stream, max_tokens=5)
    assert got["finish"] == expected
    if dialect == "responses":
        assert got["incomplete"].reason == "max_output_tokens"
        if stream:
            assert got["last_event"] == "response.incomplete"


def _recorded_error(case: str) -> tuple[int, dict[str, Any]]:
    """One of vLLM 0.32's recorded error replies (tests/fixtures/vllm/errors.json)."""
    found = next(c for c in vllm_fixture("errors")["cases"] if c["case"] == case)
    return found["status"], found["body"]


@pytest.mark.parametrize(
    "dialect, expected",
    [
        ("chat", "stop"),
        ("responses", "completed"),
        ("anthropic", "end_turn"),
        ("google", types.FinishReason.STOP),
    ],
)
@STREAMING
def test_context_overflow_ends_the_conversation_with_a_plain_stop_in_each_dialect(
    capture: CaptureServer, upstream: FakeVllm, dialect: str, expected: Any, stream: bool
) -> None:
    # Not an error: every agent retries or fails on one, while a normal end of turn ends its loop.
    info = capture.open_session()
    upstream.answer = lambda body: _recorded_error("prompt_over_context")
    got = call(dialect, info, stream=stream)
    assert got["finish"] == expected
    findings = rendered(capture.summary(info["id"])["findings"])
    assert any("context_full" in f and "maximum context length" in f for f in findings), findings


# ---- 4: system messages after the first turn -----------------------------------------------------


def _claude_second_call() -> dict[str, Any]:
    """claude-code's second call: the first re-sent, the tool round trip, then a system reminder."""
    body = copy.deepcopy(recording("claude_code")["calls"][0])
    body["messages"] += [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "Bash",
                    "input": {"command": "echo hi > hello.txt"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": "(Bash completed with no output)",
                    "is_error": False,
                }
            ],
        },
        {"role": "system", "content": "<system-reminder>The task list is empty.</system-reminder>"},
    ]
    return body


def _claude_call(info: dict[str, Any], body: dict[str, Any], *, stream: bool) -> anthropic.types.Message:
    """A claude-code body through the SDK's beta route (`POST /v1/messages?beta=true`)."""
    client = anthropic_client(info)
    known = {k: body[k] for k in ("model", "max_tokens", "system", "messages", "tools", "metadata")}
    extra = {k: v for k, v in body.items() if k not in known and k != "stream"}
    headers = recording("claude_code")["headers"]
    kwargs = dict(**known, extra_body=extra, extra_headers=headers)
    if stream:
        with client.beta.messages.stream(**kwargs) as events:
            return events.get_final_message()
    # max_tokens 128000 without streaming: the SDK wants an explicit timeout (claude-code streams).
    return client.beta.messages.create(**kwargs, timeout=60)


@STREAMING
def test_claude_code_system_messages_stay_where_the_agent_put_them(
    capture: CaptureServer, upstream: FakeVllm, stream: bool
) -> None:
    info = capture.open_session()
    _claude_call(info, _claude_second_call(), stream=stream)
    roles = [m["role"] for m in upstream.requests[-1]["messages"]]
    assert roles == ["system", "user", "system", "assistant", "tool", "system"]
    sent = upstream.requests[-1]["messages"]
    assert "billing-header" not in sent[0]["content"]  # the per-call line is stripped
    assert sent[2]["content"].startswith("<env>")


def test_template_refusing_late_system_messages_folds_them_with_a_finding(
    capture: CaptureServer, upstream: FakeVllm
) -> None:
    info = capture.open_session()

    def template(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        roles = [m["role"] for m in body["messages"]]
        if "system" in roles[1:]:
            # What vLLM answers when a template's raise_exception fires (recorded 400 envelope).
            return 400, vllm_error(400, "System message must be at the beginning.")
        return 200, _shaped(body, recorded_reply())

    upstream.answer = template
    message = _claude_call(info, _claude_second_call(), stream=True)
    assert message.content[0].text == "The capital of France is Paris."
    turn = capture.turn(info["id"], 0)
    assert any(f.startswith("[WARN] system_folded:") for f in rendered(turn["findings"])), rendered(
        turn["findings"]
    )
    assert [m["role"] for m in turn["request"]["messages"]][:2] == ["system", "user"]
    # Later calls of the session fold at once: one engine call each.
    upstream.requests.clear()
    _claude_call(info, _claude_second_call(), stream=False)
    assert len(upstream.requests) == 1


@pytest.mark.parametrize("role", ["system", "developer"])
def test_chat_and_responses_keep_a_late_system_message_in_place(
    capture: CaptureServer, upstream: FakeVllm, role: str
) -> None:
    info = capture.open_session()
    client = openai_client(info)
    client.chat.completions.create(
        model="m",
        messages=[
            {"role": "system", "content": "A"},
            {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"},
            {"role": role, "content": "reminder"},
            {"role": "user", "content": "u2"},
        ],
    )
    assert [m["role"] for m in upstream.requests[-1]["messages"]] == [
        "system",
        "user",
        "assistant",
        "system",
        "user",
    ]
    client.responses.create(
        model="m",
        input=[
            {"role": "developer", "content": "A"},
            {"role": "developer", "content": "B"},
            {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"},
            {"role": role, "content": "reminder"},
            {"role": "user", "content": "u2"},
        ],
    )
    sent = upstream.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "system", "user"]
    assert sent[0]["content"] == "A\n\nB"


# ---- 5: codex's namespace tools --------------------------------------------------------------------


def _codex_call(info: dict[str, Any], body: dict[str, Any], *, stream: bool) -> Any:
    client = openai_client(info)
    extra = {k: v for k, v in body.items() if k not in ("model", "input", "tools", "stream")}
    headers = recording("codex")["headers"]
    kwargs = dict(
        model=body["model"], input=body["input"], tools=body["tools"], extra_body=extra, extra_headers=headers
    )
    if stream:
        events = list(client.responses.create(stream=True, **kwargs))
        assert events[-1].type == "response.completed"
        return events[-1].response
    return client.responses.create(**kwargs)


@STREAMING
def test_codex_namespace_tools_round_trip(capture: CaptureServer, upstream: FakeVllm, stream: bool) -> None:
    info = capture.open_session()
    body = recording("codex")["calls"][0]
    upstream.answer = answer_with(tool_reply("multi_agent_v1__spawn_agent", '{"message": "write hello.txt"}'))
    response = _codex_call(info, body, stream=stream)
    sent = upstream.requests[-1]
    names = [t["function"]["name"] for t in sent["tools"]]
    assert names == [
        "exec_command",
        "write_stdin",
        "multi_agent_v1__spawn_agent",
        "multi_agent_v1__wait_agent",
    ]
    call_item = response.output[-1]
    assert call_item.type == "function_call"
    assert (call_item.name, call_item.namespace) == ("spawn_agent", "multi_agent_v1")  # the SDK's own field
    # codex re-sends the call as it got it (namespace + name) with its output: the engine sees the
    # flat name it sampled.
    follow = copy.deepcopy(body)
    follow["input"] += [
        call_item.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call_item.call_id, "output": "agent a1"},
    ]
    upstream.answer = "chat_basic"
    _codex_call(info, follow, stream=stream)
    assistant = upstream.requests[-1]["messages"][-2]
    assert assistant["tool_calls"][0]["function"]["name"] == "multi_agent_v1__spawn_agent"
    turn = capture.turn(info["id"], 0)
    assert [f for f in rendered(turn["findings"]) if "dropped_tools" in f] == [
        "[WARN] dropped_tools: web_search (the engine cannot run hosted tools)"
    ]


# ---- 6: JSON mode per call role ------------------------------------------------------------------


def _training_session(capture: CaptureServer) -> dict[str, Any]:
    reply = capture.admin.post("/admin/sessions", json={"rollout_type": "train"})
    reply.raise_for_status()
    return reply.json()


def test_gemini_router_gets_json_from_an_engine_that_ignores_the_schema(
    capture: CaptureServer, upstream: FakeVllm
) -> None:
    info = _training_session(capture)  # an agent turn with this format would be refused here
    response = gemini_router(info)  # the recorded engine answers prose
    assert json.loads(response.text) == {"complexity_reasoning": "", "complexity_score": 0}
    sent = upstream.requests[-1]
    assert sent["response_format"]["type"] == "json_schema"  # constrained where the engine can
    turn = capture.turn(info["id"], 0)
    assert turn["meta"]["call_role"] == "auxiliary"
    assert turn["response"]["content"] == "The capital of France is Paris."  # what was sampled
    assert any(f.startswith("[WARN] json_mode_unmet:") for f in rendered(turn["findings"]))
    roles = {
        s["role"] for s in capture.admin.get(f"/admin/sessions/{info['id']}/rollout").json()["sequences"]
    }
    assert roles == {"auxiliary"}


def test_json_mode_call_past_the_call_budget_still_gets_json(
    capture: CaptureServer, upstream: FakeVllm
) -> None:
    reply = capture.admin.post("/admin/sessions", json={"call_budget": 1})
    reply.raise_for_status()
    info = reply.json()
    gemini_router(info)  # the budget's one call
    response = gemini_router(info)  # past it: a synthetic stop, still in the schema's shape
    assert json.loads(response.text) == {"complexity_reasoning": "", "complexity_score": 0}
    assert len(upstream.requests) == 1


def test_json_answer_from_the_engine_goes_back_unchanged(capture: CaptureServer, upstream: FakeVllm) -> None:
    info = capture.open_session()
    reply = recorded_reply()
    reply["choices"][0]["message"]["content"] = '{"complexity_reasoning": "one file", "complexity_score": 2}'
    upstream.answer = answer_with(reply)
    assert json.loads(gemini_router(info).text)["complexity_score"] == 2


@pytest.mark.parametrize("how", ["response_format", "text.format"])
def test_openai_json_schema_modes_are_auxiliary_and_honoured(
    capture: CaptureServer, upstream: FakeVllm, how: str
) -> None:
    info = _training_session(capture)
    schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
    client = openai_client(info)
    if how == "response_format":
        text = (
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "title?"}],
                response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
            )
            .choices[0]
            .message.content
        )
    else:
        text = client.responses.create(
            model="m", input="title?", text={"format": {"type": "json_schema", "name": "t", "schema": schema}}
        ).output_text
    assert json.loads(text) == {"title": ""}
    assert upstream.requests[-1]["response_format"]["json_schema"]["schema"] == schema
    assert capture.turn(info["id"], 0)["meta"]["call_role"] == "auxiliary"


def test_agent_turn_in_a_training_session_is_never_constrained(capture: CaptureServer) -> None:
    info = _training_session(capture)
    with pytest.raises(openai.BadRequestError, match="guided_json"):
        openai_client(info).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"guided_json": {"type": "object"}},
        )


# ---- 7: max_tokens caps are visible ----------------------------------------------------------------


@STREAMING
def test_claude_code_max_tokens_cap_is_a_finding_and_a_cut_is_max_tokens(
    capture: CaptureServer, upstream: FakeVllm, stream: bool
) -> None:
    info = capture.open_session()
    body = recording("claude_code")["calls"][0]
    message = _claude_call(info, body, stream=stream)
    sent = upstream.requests[-1]["max_tokens"]
    assert sent < 128000
    findings = rendered(capture.turn(info["id"], 0)["findings"])
    assert (
        f"[INFO] max_tokens_capped: the agent asked for max_tokens=128000; the engine was sent {sent} "
        "(the proxy's cap)" in findings
    )
    assert message.stop_reason == "end_turn"
    upstream.answer = answer_with(recorded_reply("chat_length"))
    message = _claude_call(info, body, stream=stream)
    assert message.stop_reason == "max_tokens"
    assert any(
        f.startswith("[WARN] max_tokens_capped:") and "cut there" in f
        for f in rendered(capture.turn(info["id"], 1)["findings"])
    )


def test_session_output_limit_holds_whatever_the_agent_asks(
    capture: CaptureServer, upstream: FakeVllm
) -> None:
    # An agent may ask for more than it was configured with, or for no limit (codex does).
    reply = capture.admin.post("/admin/sessions", json={"max_output_tokens": 64})
    reply.raise_for_status()
    info = reply.json()
    client = openai.OpenAI(api_key=info["api_key"], base_url=info["base_urls"]["openai"], max_retries=0)
    client.responses.create(model="m", input="hi", max_output_tokens=2048)
    assert upstream.requests[-1]["max_tokens"] == 64
    assert (
        "[INFO] max_tokens_capped: the agent asked for max_tokens=2048; the engine was sent 64 "
        "(the proxy's cap)" in rendered(capture.turn(info["id"], 0)["findings"])
    )
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert upstream.requests[-1]["max_tokens"] == 64  # no limit asked: the session's, not the engine's
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=16)
    assert upstream.requests[-1]["max_tokens"] == 16  # a lower one asked is kept
    assert capture.admin.post("/admin/sessions", json={"max_output_tokens": 0}).status_code == 422


@pytest.mark.parametrize(
    "rollout_type, temperature, warned",
    [("train", 0, True), ("train", 0.7, False), ("eval", 0, False)],
    ids=["train-greedy", "train-sampled", "eval-greedy"],
)
def test_a_training_turn_sampled_greedily_is_a_finding(
    capture: CaptureServer, upstream: FakeVllm, rollout_type: str, temperature: float, warned: bool
) -> None:
    info = capture.open_session(rollout_type=rollout_type)
    openai_client(info).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], temperature=temperature
    )
    assert upstream.requests[-1]["temperature"] == temperature
    greedy = [f for f in rendered(capture.turn(info["id"], 0)["findings"]) if "greedy_sampling" in f]
    assert greedy == (
        [
            "[WARN] greedy_sampling: sampled at temperature 0 (greedy) in a training session: its "
            "tokens were not drawn from the policy its logprobs describe; give the rollout a "
            "temperature (the temperature setting, or training_sampling)"
        ]
        if warned
        else []
    )


# ---- 9: one access-log line per call -----------------------------------------------------------------


def test_every_call_writes_one_access_line_without_keys(
    capture: CaptureServer, upstream: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    info = capture.open_session()
    key = info["api_key"]
    caplog.set_level(logging.INFO, logger="tapdeck.access")
    call("chat", info, stream=False)
    call("anthropic", info, stream=True)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            api_key="sk-wrong", base_url=info["base_urls"]["openai"], max_retries=0
        ).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert (
        httpx.post(
            f"{capture.url}/v1beta/models/g:generateContent?key={key}", content=b"{", timeout=30
        ).status_code
        == 400
    )
    deadline = time.monotonic() + 60  # the stream's line is written as the server closes it
    while len([r for r in caplog.records if r.name == "tapdeck.access"]) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    lines = [r.getMessage() for r in caplog.records if r.name == "tapdeck.access"]
    short = info["id"][:8]
    assert len(lines) == 4, lines
    assert lines[0].startswith(f"call 200 chat /v1/chat/completions session={short} turn=0 finish=stop json ")
    assert lines[1].startswith(f"call 200 anthropic /v1/messages session={short} turn=1 finish=stop stream ")
    assert lines[2].startswith(
        "call 401 chat /v1/chat/completions session=- turn=- finish=- error=authentication_error json "
    )
    assert lines[3].startswith(f"call 400 google /v1beta/models/g:generateContent session={short} turn=- ")
    assert all(key not in line and "sk-wrong" not in line for line in lines)
    assert all(line.endswith("ms") for line in lines)


# ---- issue 11: each agent's first and second calls, as recorded -----------------------------------


@STREAMING
def test_codex_call_with_client_metadata_include_and_store_false_item_ids(
    capture: CaptureServer, upstream: FakeVllm, stream: bool
) -> None:
    info = capture.open_session()
    body = recording("codex")["calls"][0]
    response = _codex_call(info, body, stream=stream)
    assert response.status == "completed" and response.output_text == "The capital of France is Paris."
    sent = upstream.requests[-1]
    for field in ("client_metadata", "include", "store", "prompt_cache_key", "reasoning", "input"):
        assert field not in sent  # Responses-only fields are not forwarded to a chat engine
    assert [(m["role"], m["content"][:20]) for m in sent["messages"]] == [
        ("system", "You are Codex, a cod"),
        ("user", "<environment_context"),
        ("user", "create hello.txt con"),
    ]
    assert sent["messages"][0]["content"].endswith("<permissions>approval_policy=never</permissions>")
    # store: false: the response is not kept, so naming it later is a clear 400.
    with pytest.raises(openai.BadRequestError, match=response.id):
        openai_client(info).responses.create(model="m", input="again", previous_response_id=response.id)


@STREAMING
def test_claude_code_thinking_output_config_context_management_and_deferred_tools(
    capture: CaptureServer, upstream: FakeVllm, stream: bool
) -> None:
    info = capture.open_session()
    message = _claude_call(info, recording("claude_code")["calls"][0], stream=stream)
    assert message.content[0].text == "The capital of France is Paris."
    sent = upstream.requests[-1]
    for field in ("thinking", "output_config", "context_management", "metadata", "system"):
        assert field not in sent
    assert [t["function"]["name"] for t in sent["tools"]] == ["Bash", "Write", "DeferredToolPlaceholder"]
    assert all("defer_loading" not in t["function"] for t in sent["tools"])
    assert capture.turn(info["id"], 0)["meta"]["path"] == "/v1/messages"


def _gemini_main(info: dict[str, Any], contents: list[dict[str, Any]], *, stream: bool) -> list[Any]:
    body = recording("gemini_cli")["main"]["body"]
    config = types.GenerateContentConfig.model_validate(
        {**body["generationConfig"], "systemInstruction": body["systemInstruction"], "tools": body["tools"]}
    )
    client = google_client(info)
    kwargs = dict(
        model="gemini-3.8-flash", contents=[types.Content.model_validate(c) for c in contents], config=config
    )
    if stream:
        return list(client.models.generate_content_stream(**kwargs))
    return [client.models.generate_content(**kwargs)]


@STREAMING
def test_gemini_cli_parameters_json_schema_invented_call_ids_and_thought_signature(
    capture: CaptureServer, upstream: FakeVllm, stream: bool
) -> None:
    info = capture.open_session()
    first = recording("gemini_cli")["main"]["body"]["contents"]
    upstream.answer = answer_with(tool_reply("run_shell_command", '{"command": "echo hi > hello.txt"}'))
    chunks = _gemini_main(info, first, stream=stream)
    call_part = chunks[-1].candidates[0].content.parts[-1].function_call
    assert (call_part.name, call_part.args) == ("run_shell_command", {"command": "echo hi > hello.txt"})
    assert upstream.requests[-1]["tools"][0]["function"]["parameters"]["required"] == ["command"]
    # gemini-cli's second call: its own call id and the skip-validator signature on the model turn.
    invented = "run_shell_command_1796000000000_0"
    second = [
        *first,
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {
                        "id": invented,
                        "name": "run_shell_command",
                        "args": {"command": "echo hi > hello.txt"},
                    },
                    "thoughtSignature": "skip_thought_signature_validator",
                }
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": invented,
                        "name": "run_shell_command",
                        "response": {"output": "(no output)"},
                    }
                }
            ],
        },
    ]
    upstream.answer = "chat_basic"
    chunks = _gemini_main(info, second, stream=stream)
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assistant, tool = upstream.requests[-1]["messages"][-2:]
    assert assistant["tool_calls"][0]["id"] == invented and tool["tool_call_id"] == invented


def test_opencode_title_call_is_auxiliary_and_the_quoted_prompt_passes_verbatim(
    capture: CaptureServer, upstream: FakeVllm
) -> None:
    info = capture.open_session()
    rec = recording("opencode")
    client = openai_client(info)
    headers = rec["headers"]

    def stream(body: dict[str, Any]) -> str:
        extra = {k: v for k, v in body.items() if k not in ("model", "messages", "tools", "stream")}
        chunks = client.chat.completions.create(
            model=body["model"],
            messages=body["messages"],
            tools=body.get("tools", openai.omit),
            stream=True,
            extra_body=extra,
            extra_headers=headers,
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:  # opencode sends its title call alongside the first turn
        title, main = pool.map(stream, [rec["title"], rec["main"]])
    assert title == main == "The capital of France is Paris."
    second = copy.deepcopy(rec["main"])
    second["messages"] += [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "bash",
                        "arguments": '{"command":"echo hi > hello.txt","description":"write"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "(no output)"},
    ]
    stream(second)
    users = [m["content"] for r in upstream.requests[-3:] for m in r["messages"] if m["role"] == "user"]
    assert '"create hello.txt containing hi"' in users
    assert upstream.requests[-1]["messages"][2]["content"] == ""
    doc = capture.admin.get(f"/admin/sessions/{info['id']}/rollout").json()
    roles = {t["seq"]: t["role"] for t in doc["turns"]}
    title = next(
        s
        for s in roles
        if capture.turn(info["id"], s)["request"]["messages"][0]["content"].startswith(
            "You are a title generator"
        )
    )
    assert roles.pop(title) == "auxiliary" and list(roles.values()) == ["agent", "agent"]
    assert capture.turn(info["id"], title)["meta"]["header_session_id"] == "ses_0a1b2c3d4e5f"


@STREAMING
def test_qwen_code_parts_array_tool_result_and_null_assistant_content(
    capture: CaptureServer, upstream: FakeVllm, stream: bool
) -> None:
    info = capture.open_session()
    body = copy.deepcopy(recording("qwen_code")["chat"]["body"])
    body["messages"] += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_q1",
                    "type": "function",
                    "function": {
                        "name": "run_shell_command",
                        "arguments": '{"command":"echo hi > hello.txt"}',
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_q1",
            "content": [{"type": "text", "text": "Command: echo hi > hello.txt\nExit Code: 0"}],
        },
    ]
    extra = {k: v for k, v in body.items() if k not in ("model", "messages", "tools", "stream", "max_tokens")}
    client = openai_client(info)
    kwargs = dict(
        model=body["model"],
        messages=body["messages"],
        tools=body["tools"],
        max_tokens=body["max_tokens"],
        extra_body=extra,
    )
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        assert chunks[-1].usage.completion_tokens > 0  # stream_options.include_usage honoured
    else:
        assert client.chat.completions.create(**kwargs).choices[0].finish_reason == "stop"
    tool = upstream.requests[-1]["messages"][-1]
    assert tool["content"] == [{"type": "text", "text": "Command: echo hi > hello.txt\nExit Code: 0"}]
    assert any(
        f.startswith("[INFO] max_tokens_capped: the agent asked for max_tokens=32000")
        for f in rendered(capture.turn(info["id"], 0)["findings"])
    )


@STREAMING
def test_qwen_code_anthropic_mode_bearer_auth_and_budget_equal_to_max_tokens(
    capture: CaptureServer, upstream: FakeVllm, stream: bool
) -> None:
    info = capture.open_session()
    rec = recording("qwen_code")["anthropic"]
    body = rec["body"]
    client = anthropic_client(info, bearer=True)
    kwargs = dict(
        model=body["model"],
        max_tokens=body["max_tokens"],
        system=body["system"],
        messages=body["messages"],
        tools=body["tools"],
        thinking=body["thinking"],
        extra_body={"temperature": body["temperature"]},
        extra_headers=rec["headers"],
    )
    if stream:
        with client.messages.stream(**kwargs) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs, timeout=60)
    assert message.stop_reason == "end_turn"
    assert "thinking" not in upstream.requests[-1]


def test_mini_swe_agent_assistant_without_content_key_non_streaming(
    capture: CaptureServer, upstream: FakeVllm
) -> None:
    info = capture.open_session()
    body = copy.deepcopy(recording("mini_swe_agent")["body"])
    body["messages"] += [
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_m1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "echo hi > hello.txt"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_m1", "content": '{"returncode":0,"output":""}'},
    ]
    # litellm reads the raw response (x-stainless-raw-response: true), then parses it.
    reply = (
        openai_client(info)
        .chat.completions.with_raw_response.create(
            model=body["model"], messages=body["messages"], tools=body["tools"]
        )
        .parse()
    )
    assert reply.choices[0].message.content == "The capital of France is Paris."
    assistant = upstream.requests[-1]["messages"][2]
    assert assistant["role"] == "assistant" and "content" not in assistant


def test_other_400s_with_late_system_messages_are_not_folded(
    capture: CaptureServer, upstream: FakeVllm
) -> None:
    info = capture.open_session()
    upstream.requests.clear()  # the engine probe's
    upstream.answer = lambda body: (
        400,
        vllm_error(400, "max_tokens=100000 cannot be greater than max_model_len=2048."),
    )
    with pytest.raises(anthropic.BadRequestError, match="max_model_len"):
        _claude_call(info, _claude_second_call(), stream=True)
    assert len(upstream.requests) == 1  # no folded retry
