"""Property-based fuzzing of the engine side (hypothesis): whatever an engine answers with HTTP 200.

A fake engine answers the proxy's call with a recorded vLLM body (tests/fixtures/vllm) whose
fields hypothesis has replaced or deleted: wrong types, missing fields, huge numbers, nesting
deeper than any encoder here writes, junk inside the tool calls, the logprobs and the usage. Each
reply reaches the proxy through a model call of every dialect, plain and streamed (the proxy
synthesises the stream). The server must never fail on it: the caller gets a 200 in its dialect's
shape, or a 502 `bad_reply` in its dialect's error envelope; no log record says tapdeck failed;
and afterwards the session's admin reads and its export (what `tapdeck export` writes) succeed and
validate into the contract's models.

Examples per route: ENGINE_FUZZ_EXAMPLES, unless `TAPDECK_FUZZ_EXAMPLES` raises it.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from tapdeck.app.commands.export import session_rows
from tapdeck.app.host import LocalServer
from tapdeck.proxy.capture.export import write_jsonl, write_parquet
from tapdeck.proxy.config import CAPTURE_DB, ServerConfig
from tapdeck.proxy.store.database import Store
from tapdeck.schema.sessions import (
    GraphView,
    RolloutDocument,
    SessionDetail,
    TrainingTrace,
    TurnDetail,
)
from tests.support.fake_vllm import FakeVllm
from tests.support.json_strategies import json_values
from tests.support.log_catcher import TracebackCatcher
from tests.support.vllm_recordings import vllm_fixture as recorded
from tests.support.vllm_recordings import vllm_reply_to

ENGINE_FUZZ_EXAMPLES = 15
EXAMPLES = int(os.environ.get("TAPDECK_FUZZ_EXAMPLES") or ENGINE_FUZZ_EXAMPLES)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)

BASES = ["chat_basic", "chat_tools_call", "chat_length", "chat_token_id_strings", "chat_top2"]
"""Recorded replies the fuzzer starts from (plain text, a tool call, a cut reply, `token_id:N`
logprob tokens, alternatives)."""

_C, _M, _LP = ("choices", 0), ("choices", 0, "message"), ("choices", 0, "logprobs", "content")
FIELDS: list[tuple[Any, ...]] = [
    (),
    ("id",),
    ("object",),
    ("created",),
    ("model",),
    ("system_fingerprint",),
    ("kv_transfer_params",),
    ("prompt_token_ids",),
    ("prompt_token_ids", 0),
    ("usage",),
    ("usage", "prompt_tokens"),
    ("usage", "completion_tokens"),
    ("usage", "total_tokens"),
    ("usage", "prompt_tokens_details"),
    ("usage", "prompt_tokens_details", "cached_tokens"),
    ("usage", "completion_tokens_details"),
    ("choices",),
    _C,
    ("choices", 1),
    (*_C, "message"),
    (*_C, "finish_reason"),
    (*_C, "stop_reason"),
    (*_C, "logprobs"),
    (*_C, "token_ids"),
    (*_C, "token_ids", 0),
    (*_C, "index"),
    (*_C, "prompt_token_ids"),
    (*_M, "content"),
    (*_M, "role"),
    (*_M, "reasoning"),
    (*_M, "reasoning_content"),
    (*_M, "refusal"),
    (*_M, "function_call"),
    (*_M, "tool_calls"),
    (*_M, "tool_calls", 0),
    (*_M, "tool_calls", 1),
    (*_M, "tool_calls", 0, "id"),
    (*_M, "tool_calls", 0, "type"),
    (*_M, "tool_calls", 0, "function"),
    (*_M, "tool_calls", 0, "function", "name"),
    (*_M, "tool_calls", 0, "function", "arguments"),
    (*_LP[:-1],),
    _LP,
    (*_LP, 0),
    (*_LP, 1),
    (*_LP, 0, "logprob"),
    (*_LP, 0, "token"),
    (*_LP, 0, "bytes"),
    (*_LP, 0, "top_logprobs"),
    (*_LP, 0, "top_logprobs", 0),
    (*_LP, 0, "top_logprobs", 0, "logprob"),
    (*_LP, 0, "top_logprobs", 0, "token"),
]
"""Where a reply is changed: every field the proxy or a dialect reads, and some it passes on."""

DEEP, HUGE_INT, HUGE_FLOAT, U64 = "\x00DEEP\x00", "\x00HUGEINT\x00", "\x00HUGEFLOAT\x00", "\x00U64\x00"
_RAW = {
    DEEP: b"[" * 300 + b"1" + b"]" * 300,
    HUGE_INT: b"1" + b"0" * 40,
    HUGE_FLOAT: b"1e308",
    U64: b"18446744073709551615",
}
"""Values written into the encoded reply as text: nesting past what orjson writes back (255), a
number past 64 bits (parsed as a float), the largest finite double, the largest u64."""

_KEYS = [
    "type",
    "text",
    "role",
    "content",
    "name",
    "arguments",
    "function",
    "id",
    "token",
    "logprob",
    "bytes",
    "top_logprobs",
    "tool_calls",
    "prompt_tokens",
    "cached_tokens",
]
JSON = json_values(
    _KEYS,
    [
        "",
        "stop",
        "length",
        "tool_calls",
        "assistant",
        "token_id:1",
        '{"a": 1}',
        DEEP,
        HUGE_INT,
        HUGE_FLOAT,
        U64,
    ],
    text_size=10,
    max_leaves=6,
)


def _encode(body: Any) -> bytes:
    raw = orjson.dumps(body)
    for marker, text in _RAW.items():
        raw = raw.replace(orjson.dumps(marker), text)
    return raw


def _changed(body: Any, path: tuple[Any, ...], value: Any, delete: bool) -> Any:
    """`body` with the field at `path` set to `value` (or deleted); unchanged where the path's
    parent is not there. An index one past a list's end appends."""
    if not path:
        return value
    target = body
    for step in path[:-1]:
        if isinstance(step, int):
            if not isinstance(target, list) or step >= len(target):
                return body
        elif not isinstance(target, dict) or step not in target:
            return body
        target = target[step]
    last = path[-1]
    if isinstance(last, int):
        if not isinstance(target, list) or last > len(target):
            return body
        if delete:
            if last < len(target):
                target.pop(last)
        elif last == len(target):
            target.append(value)
        else:
            target[last] = value
    elif isinstance(target, dict):
        if delete:
            target.pop(last, None)
        else:
            target[last] = value
    return body


@st.composite
def engine_replies(draw: st.DrawFn) -> tuple[str, bytes]:
    """A recorded reply with one to three fields replaced or deleted: what was changed (for a
    failure's report) and the bytes sent."""
    base = draw(st.sampled_from(BASES))
    body = copy.deepcopy(recorded(base)["response"])
    changes = [base]
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(FIELDS))
        delete = bool(path) and draw(st.booleans())
        value = None if delete else draw(JSON)
        changes.append(f"{'/'.join(map(str, path)) or '(the body)'}: {'deleted' if delete else repr(value)}")
        body = _changed(body, path, value, delete)
    return "; ".join(changes), _encode(body)


# ----------------------------------------------------------------------------- the engine


class FuzzedEngine(FakeVllm):
    """The fake vLLM answering with `reply` (raw bytes) when one is set, else the recorded reply."""

    def __init__(self) -> None:
        self.reply: bytes | None = None
        basic = recorded("chat_basic")["response"]
        super().__init__(
            answer=lambda body: (200, self.reply if self.reply is not None else vllm_reply_to(body, basic))
        )


# ----------------------------------------------------------------------------- the routes

TOOLS = {
    "chat": [{"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object"}}}],
    "responses": [{"type": "function", "name": "run_shell", "parameters": {"type": "object"}}],
    "anthropic": [{"name": "run_shell", "input_schema": {"type": "object"}}],
    "google": [{"functionDeclarations": [{"name": "run_shell", "parameters": {"type": "object"}}]}],
}
REQUESTS: dict[str, dict[str, Any]] = {
    "chat": {
        "model": "m",
        "max_tokens": 24,
        "tools": TOOLS["chat"],
        "logprobs": True,
        "top_logprobs": 1,
        "return_token_ids": True,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    },
    "responses": {
        "model": "m",
        "max_output_tokens": 24,
        "instructions": "Be brief.",
        "tools": TOOLS["responses"],
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 1,
        "input": [{"role": "user", "content": "Hi"}],
    },
    "anthropic": {
        "model": "m",
        "max_tokens": 24,
        "system": "Be brief.",
        "tools": TOOLS["anthropic"],
        "messages": [{"role": "user", "content": "Hi"}],
    },
    "google": {
        "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "tools": TOOLS["google"],
        "generationConfig": {"maxOutputTokens": 24, "responseLogprobs": True, "logprobs": 1},
    },
}
# (route, dialect, path, streamed)
ROUTES = [
    ("chat", "chat", "/v1/chat/completions", False),
    ("chat-stream", "chat", "/v1/chat/completions", True),
    ("responses", "responses", "/v1/responses", False),
    ("responses-stream", "responses", "/v1/responses", True),
    ("messages", "anthropic", "/v1/messages", False),
    ("messages-stream", "anthropic", "/v1/messages", True),
    ("generate", "google", "/v1beta/models/m:generateContent", False),
    ("generate-sse", "google", "/v1beta/models/m:streamGenerateContent?alt=sse", True),
    ("generate-array", "google", "/v1beta/models/m:streamGenerateContent", True),
]


def _request(route: tuple[str, str, str, bool]) -> dict[str, Any]:
    _name, dialect, _path, streamed = route
    body = REQUESTS[dialect]
    if streamed and dialect != "google":
        body = {**body, "stream": True}
        if dialect == "chat":
            body["stream_options"] = {"include_usage": True}
    return body


# ----------------------------------------------------------------------------- the checks


def _error_message(dialect: str, body: Any) -> str:
    """The message of an error body in `dialect`'s envelope (an AssertionError if it is not one)."""
    if dialect == "anthropic":
        assert isinstance(body, dict) and body.get("type") == "error", body
    else:
        assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    message = body["error"].get("message")
    assert isinstance(message, str) and message, body
    return message


def _assert_answer(dialect: str, body: Any) -> None:
    """A 200 body in `dialect`'s shape."""
    assert isinstance(body, dict), body
    if dialect == "chat":
        assert len(body["choices"]) == 1, body
        assert isinstance(body["choices"][0]["message"], dict), body
    elif dialect == "responses":
        assert body.get("object") == "response" and isinstance(body.get("output"), list), body
    elif dialect == "anthropic":
        assert body.get("type") == "message" and isinstance(body.get("content"), list), body
    else:
        assert isinstance(body.get("candidates"), list) and body["candidates"], body


def _events(resp: httpx.Response) -> list[Any]:
    """The JSON data of a stream: SSE events (`[DONE]` left out) or the elements of a JSON array."""
    text = resp.text
    if resp.headers["content-type"].startswith("application/json"):
        items = orjson.loads(text)
        assert isinstance(items, list), text[:300]
        return items
    out = []
    for block in filter(None, (b.strip() for b in text.split("\n\n"))):
        lines = [line.rstrip("\r") for line in block.split("\n") if not line.startswith(":")]
        if not lines:
            continue
        if lines[0].startswith("{"):  # Google's bare error chunk
            out.append(orjson.loads(block))
            continue
        data = [line[5:].strip() for line in lines if line.startswith("data:")]
        assert data and all(line.startswith(("event:", "data:", "id:")) for line in lines), block
        if data != ["[DONE]"]:
            out.append(orjson.loads("\n".join(data)))
    return out


def _check_call(dialect: str, streamed: bool, resp: httpx.Response) -> bool:
    """The call's answer is a 200 in the dialect's shape or a 502 `bad_reply` in its envelope;
    True when it was answered (a turn is then stored)."""
    assert resp.status_code in (200, 502), (resp.status_code, resp.text[:500])
    assert "Traceback" not in resp.text, resp.text[:500]
    if resp.status_code == 502:
        message = _error_message(dialect, resp.json())
        assert "answered" in message, message  # the engine's fault, said as such
        return False
    if not streamed:
        _assert_answer(dialect, resp.json())
        return True
    events = _events(resp)
    assert events, resp.text[:300]
    for event in events:
        failed = event.get("error") or (event.get("response") or {}).get("error")
        assert not failed, event  # no error inside a stream: the engine had answered in full
    return True


def _check_reads(fuzzed: dict[str, Any], session_id: str, answered: bool) -> None:
    """Every admin read of the session answers and validates into the contract's models, and its
    export writes; the session holds one turn if the call was answered, none otherwise."""
    admin: httpx.Client = fuzzed["admin"]
    base = f"/admin/sessions/{session_id}"
    detail = admin.get(base)
    assert detail.status_code == 200, detail.text[:500]
    assert SessionDetail.model_validate(detail.json()).turns == int(answered)
    rollout = admin.get(f"{base}/rollout")
    assert rollout.status_code == 200, rollout.text[:500]
    doc = RolloutDocument.model_validate(rollout.json())
    assert len(doc.turns) == int(answered)
    trace = admin.get(f"{base}/trace")
    assert trace.status_code in (200, 409), trace.text[:500]
    if trace.status_code == 200:
        TrainingTrace.model_validate(trace.json())
    graph = admin.get(f"{base}/graph")
    assert graph.status_code == 200, graph.text[:500]
    GraphView.model_validate(graph.json())
    for turn in doc.turns:
        got = admin.get(f"{base}/turns/{turn.seq}")
        assert got.status_code == 200, got.text[:500]
        TurnDetail.model_validate(got.json())
    # What `tapdeck export SESSION` writes, from the store the server wrote.
    store = Store(fuzzed["data"] / CAPTURE_DB, read_only=True)
    try:
        rows = session_rows(store, session_id)
    finally:
        store.close()
    write_jsonl(fuzzed["exports"] / "rows.jsonl", rows)
    write_parquet(fuzzed["exports"] / "rows.parquet", rows)


# ----------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One server for the module, its engine the fake one, and the log catcher."""
    catcher = TracebackCatcher()
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.error", "tapdeck")]
    for logger in loggers:
        logger.addHandler(catcher)
    engine = FuzzedEngine().start()
    root: Path = tmp_path_factory.mktemp("engine-fuzz")
    try:
        server = LocalServer(
            ServerConfig(host="127.0.0.1", port=0, engine_url=engine.base_url, data_dir=root / "data")
        ).start()
        try:
            with httpx.Client(
                base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {server.admin_key}"}
            ) as admin:
                yield {
                    "server": server,
                    "admin": admin,
                    "engine": engine,
                    "catcher": catcher,
                    "data": root / "data",
                    "exports": root / "exports",
                }
        finally:
            server.stop()
    finally:
        engine.stop()
        for logger in loggers:
            logger.removeHandler(catcher)


@pytest.fixture
def clean_logs(fuzzed: dict[str, Any]) -> Iterator[None]:
    fuzzed["catcher"].bad.clear()
    yield
    assert not fuzzed["catcher"].bad, fuzzed["catcher"].bad[:3]


def call_with_reply(
    fuzzed: dict[str, Any], route: tuple[str, str, str, bool], reply: bytes
) -> tuple[str, httpx.Response]:
    """A new session's one model call on `route`, its engine answering `reply`: (session id, answer)."""
    admin: httpx.Client = fuzzed["admin"]
    opened = admin.post("/admin/sessions", json={})
    assert opened.status_code == 200, opened.text
    info = opened.json()
    assert info["tier"] == "tokens", info  # the fake engine gives ids and logprobs
    fuzzed["engine"].reply = reply
    try:
        resp = httpx.post(
            f"{fuzzed['server'].url}{route[2]}",
            json=_request(route),
            timeout=60,
            headers={"Authorization": f"Bearer {info['api_key']}", "x-api-key": info["api_key"]},
        )
    finally:
        fuzzed["engine"].reply = None
    return info["id"], resp


@pytest.mark.parametrize("route", ROUTES, ids=[r[0] for r in ROUTES])
@FUZZ
@given(changed=engine_replies())
def test_any_engine_reply_is_answered_and_leaves_the_session_readable(fuzzed, clean_logs, route, changed):
    what, reply = changed
    note(f"the recorded reply changed: {what}")
    session_id, resp = call_with_reply(fuzzed, route, reply)
    try:
        answered = _check_call(route[1], route[3], resp)
        assert not fuzzed["catcher"].bad, fuzzed["catcher"].bad[:3]
        _check_reads(fuzzed, session_id, answered)
    finally:
        fuzzed["admin"].delete(f"/admin/sessions/{session_id}")


# ----------------------------------------------------------------------------- named cases


def _recorded_with(base: str, path: tuple[Any, ...], value: Any) -> bytes:
    return _encode(_changed(copy.deepcopy(recorded(base)["response"]), path, value, False))


def _session(fuzzed: dict[str, Any], session_id: str) -> tuple[SessionDetail, RolloutDocument]:
    admin: httpx.Client = fuzzed["admin"]
    detail = SessionDetail.model_validate(admin.get(f"/admin/sessions/{session_id}").json())
    return detail, RolloutDocument.model_validate(admin.get(f"/admin/sessions/{session_id}/rollout").json())


@pytest.mark.parametrize("route", ROUTES, ids=[r[0] for r in ROUTES])
@pytest.mark.parametrize(
    "path, value, words",
    [
        (
            (*_M, "tool_calls"),
            '[{"id": "call_1", "type": "function"}]',
            '`choices[0].message.tool_calls` is a string ("[{\\"id\\"',
        ),
        ((*_C, "finish_reason"), ["stop"], '`choices[0].finish_reason` is a list (["stop"])'),
        ((*_M, "content"), {"text": "Paris"}, "`choices[0].message.content` is an object"),
        (
            (*_M, "tool_calls", 0, "function", "arguments"),
            {"command": "ls"},
            "`choices[0].message.tool_calls[0].function.arguments` is an object",
        ),
    ],
    ids=["tool_calls-string", "finish_reason-list", "content-object", "arguments-object"],
)
def test_a_reply_the_agent_cannot_be_answered_with_is_a_502_naming_the_field(
    fuzzed, clean_logs, route, path, value, words
):
    session_id, resp = call_with_reply(fuzzed, route, _recorded_with("chat_tools_call", path, value))
    assert resp.status_code == 502, resp.text[:300]
    message = _error_message(route[1], resp.json())
    assert words in message and "cannot pass on" in message, message
    if route[1] in ("chat", "responses"):
        assert resp.json()["error"]["type"] == "bad_reply"
    detail, doc = _session(fuzzed, session_id)
    assert detail.turns == 0 and not doc.turns  # nothing of it is recorded
    assert any(f.code == "engine_unreachable" and "bad_reply" in f.detail for f in detail.findings)


@pytest.mark.parametrize("route", ROUTES, ids=[r[0] for r in ROUTES])
@pytest.mark.parametrize(
    "path, value, level, code, words",
    [
        (("usage",), [37, 24], "WARN", "reply_cleaned", "`usage` (a list ([37,24]))"),
        (
            ("usage", "prompt_tokens_details"),
            {"cached_tokens": "all"},
            "WARN",
            "reply_cleaned",
            "`usage.prompt_tokens_details.cached_tokens` (a string",
        ),
        (
            ("usage", "prompt_tokens_details"),
            1,
            "WARN",
            "reply_cleaned",
            "`usage.prompt_tokens_details` (a number (1))",
        ),
        # Past what a JavaScript agent reads exactly; and the Responses and Google dialects' sum
        # of counts overflowed the 64 bits orjson writes (a 500, found by a sweep of the fuzzer's
        # values over every field).
        (("usage", "completion_tokens"), U64, "WARN", "reply_cleaned", "`usage.completion_tokens` (a number"),
        ((*_C, "stop_reason"), {"why": "eos"}, "WARN", "reply_cleaned", "`choices[0].stop_reason`"),
        ((*_C, "token_ids"), "1 2 3", "FATAL", "bad_sampled_ids", "`choices[0].token_ids` is a string"),
        (
            (*_LP, 0, "top_logprobs"),
            {"<": -1.1},
            "FATAL",
            "bad_logprobs",
            "`choices[0].logprobs.content[0].top_logprobs` is an object",
        ),
        # Nesting past what orjson writes back (found by the fuzzer: a 500 on the Responses
        # routes, which pass the bytes on, and on the chat routes, which pass the unread copy on).
        (
            (*_LP, 0, "bytes"),
            [DEEP],
            "FATAL",
            "bad_logprobs",
            "`choices[0].logprobs.content[0].bytes` is a list",
        ),
        (
            (*_LP, 0, "top_logprobs", 0, "bytes"),
            DEEP,
            "FATAL",
            "bad_logprobs",
            "`choices[0].logprobs.content[0].top_logprobs[0].bytes` is a list",
        ),
        (
            (*_C, "prompt_token_ids"),
            [DEEP],
            "WARN",
            "reply_cleaned",
            "`choices[0].prompt_token_ids` (nested more than 32 levels deep)",
        ),
    ],
    ids=[
        "usage-list",
        "usage-detail-string",
        "usage-details-number",
        "usage-count-u64",
        "stop_reason-object",
        "token_ids-string",
        "top_logprobs-object",
        "bytes-deep",
        "alternative-bytes-deep",
        "choice-prompt-ids-deep",
    ],
)
def test_a_field_the_answer_does_not_need_is_dropped_with_a_finding(
    fuzzed, clean_logs, route, path, value, level, code, words
):
    session_id, resp = call_with_reply(fuzzed, route, _recorded_with("chat_tools_call", path, value))
    assert resp.status_code == 200, resp.text[:300]
    _detail, doc = _session(fuzzed, session_id)
    found = [f for f in doc.turns[0].findings if f.code == code]
    assert len(found) == 1 and found[0].level == level and words in found[0].detail, doc.turns[0].findings
    # A capture field dropped leaves the turn untrainable; bookkeeping dropped does not.
    assert doc.ok is (level == "WARN")
    if route[0] == "chat":  # the reply as passed on: what was dropped is not there
        answer = resp.json()
        choice = answer["choices"][0]
        assert answer["usage"]["prompt_tokens"] == (0 if path == ("usage",) else 228)
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert choice["stop_reason"] is None
        assert ("token_ids" in choice) is (code != "bad_sampled_ids")
        assert (choice["logprobs"] is None) is (code == "bad_logprobs")
        assert "prompt_token_ids" not in choice  # vLLM writes none there; SGLang's deep one is dropped
