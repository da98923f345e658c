"""Property-based fuzzing of every route a tapdeck server answers (hypothesis).

One real server (its engine a loopback upstream answering with recorded vLLM bodies) takes
requests built from a valid one per dialect with one field replaced by arbitrary JSON (wrong types,
huge numbers, deep nesting), arbitrary JSON bodies, raw bytes (invalid UTF-8, truncated JSON),
oversized bodies and unknown paths, streaming and not; and the admin routes take the same. Every
answer must be below 500, carry no traceback, and be the route's own error envelope (or a
well-formed stream); no log record may carry a traceback.

Examples per property (and per route for the wrongly-typed fields): FUZZ_EXAMPLES, CI's bounded
count, unless `TAPDECK_FUZZ_EXAMPLES` raises it for a longer run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tapdeck.proxy.http import token_counts as aux
from tests.support.json_strategies import json_values
from tests.support.local_server import server_with_upstream
from tests.support.log_catcher import TracebackCatcher

FUZZ_EXAMPLES = 40
EXAMPLES = int(os.environ.get("TAPDECK_FUZZ_EXAMPLES") or FUZZ_EXAMPLES)
BODY_LIMIT = 64 * 1024
"""The fuzzed server's body cap: small, so oversized bodies cost little to send."""
BIG_INT, BIG_FLOAT, NEG_BIG = "\x00BIGINT\x00", "\x00BIGFLOAT\x00", "\x00NEGBIG\x00"
"""Markers replaced in the encoded body by numbers no JSON encoder here writes."""
_BIG_TEXT = {BIG_INT: b"1" + b"0" * 40, BIG_FLOAT: b"1e400", NEG_BIG: b"-99999999999999999999999"}

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
        # clean_logs checks the whole run's log once more at the end
        HealthCheck.function_scoped_fixture,
    ],
)

BASES: dict[str, dict[str, Any]] = {
    "chat": {
        "model": "m",
        "max_tokens": 4,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    },
    "responses": {
        "model": "m",
        "max_output_tokens": 4,
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    },
    "anthropic": {
        "model": "m",
        "max_tokens": 4,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
    },
    "google": {
        "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {"maxOutputTokens": 4},
        "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "object"}}]}],
    },
}
"""A valid request per dialect: the fuzzer replaces one field of it."""
BASES["anthropic_count"] = {k: v for k, v in BASES["anthropic"].items() if k != "max_tokens"}
BASES["google_count"] = {"contents": BASES["google"]["contents"]}

FIELDS: dict[str, list[tuple[Any, ...]]] = {
    "chat": [
        ("messages",),
        ("messages", 1),
        ("messages", 1, "content"),
        ("messages", 1, "role"),
        ("messages", 0, "content"),
        ("tools",),
        ("tools", 0),
        ("tools", 0, "function"),
        ("tool_choice",),
        ("stop",),
        ("temperature",),
        ("max_tokens",),
        ("response_format",),
        ("stream_options",),
        ("n",),
        ("top_logprobs",),
        ("logprobs",),
        ("seed",),
        ("model",),
        ("messages", 1, "tool_calls"),
        ("reasoning_effort",),
        ("max_completion_tokens",),
    ],
    "responses": [
        ("input",),
        ("input", 0),
        ("input", 0, "content"),
        ("input", 0, "content", 0),
        ("input", 0, "content", 0, "text"),
        ("input", 0, "role"),
        ("input", 0, "type"),
        ("instructions",),
        ("tools",),
        ("tools", 0),
        ("tool_choice",),
        ("text",),
        ("reasoning",),
        ("previous_response_id",),
        ("max_output_tokens",),
        ("temperature",),
        ("include",),
        ("store",),
        ("model",),
        ("top_logprobs",),
    ],
    "anthropic": [
        ("messages",),
        ("messages", 0),
        ("messages", 0, "content"),
        ("messages", 0, "content", 0),
        ("messages", 0, "content", 0, "text"),
        ("messages", 0, "content", 0, "type"),
        ("messages", 0, "role"),
        ("system",),
        ("system", 0),
        ("system", 0, "text"),
        ("tools",),
        ("tools", 0),
        ("tools", 0, "input_schema"),
        ("tool_choice",),
        ("stop_sequences",),
        ("output_config",),
        ("thinking",),
        ("temperature",),
        ("max_tokens",),
        ("top_k",),
        ("metadata",),
        ("model",),
    ],
    "google": [
        ("contents",),
        ("contents", 0),
        ("contents", 0, "parts"),
        ("contents", 0, "parts", 0),
        ("contents", 0, "parts", 0, "text"),
        ("contents", 0, "role"),
        ("systemInstruction",),
        ("systemInstruction", "parts"),
        ("generationConfig",),
        ("generationConfig", "maxOutputTokens"),
        ("generationConfig", "stopSequences"),
        ("generationConfig", "responseMimeType"),
        ("generationConfig", "responseSchema"),
        ("generationConfig", "temperature"),
        ("generationConfig", "thinkingConfig"),
        ("tools",),
        ("tools", 0),
        ("tools", 0, "functionDeclarations"),
        ("toolConfig",),
    ],
}
FIELDS["anthropic_count"] = FIELDS["anthropic"]
FIELDS["google_count"] = [f for f in FIELDS["google"] if f[0] == "contents"]

# (route name, dialect, path, streams?) for every model route.
ROUTES = [
    ("chat", "chat", "/v1/chat/completions", False),
    ("chat-stream", "chat", "/v1/chat/completions", True),
    ("responses", "responses", "/v1/responses", False),
    ("responses-stream", "responses", "/v1/responses", True),
    ("messages", "anthropic", "/v1/messages", False),
    ("messages-stream", "anthropic", "/v1/messages", True),
    ("count_tokens", "anthropic_count", "/v1/messages/count_tokens", False),
    ("generate", "google", "/v1beta/models/m:generateContent", False),
    ("generate-sse", "google", "/v1beta/models/m:streamGenerateContent?alt=sse", True),
    ("generate-array", "google", "/v1beta/models/m:streamGenerateContent", True),
    ("count_tokens-google", "google_count", "/v1beta/models/m:countTokens", False),
]
ENVELOPE = {
    "chat": "openai",
    "responses": "openai",
    "anthropic": "anthropic",
    "anthropic_count": "anthropic",
    "google": "google",
    "google_count": "google",
}

KEYS = [
    "type",
    "text",
    "role",
    "content",
    "parts",
    "name",
    "input_schema",
    "function",
    "arguments",
    "tool_calls",
    "id",
    "call_id",
    "output",
    "functionCall",
    "args",
    "inlineData",
    "data",
    "image_url",
    "url",
    "source",
    "thought",
    "signature",
    "schema",
    "json_schema",
    "properties",
]
JSON = json_values(
    KEYS,
    [
        "text",
        "user",
        "assistant",
        "tool",
        "function",
        "image",
        "input_text",
        "tool_use",
        "tool_result",
        "json_schema",
        "json_object",
        "auto",
        "none",
        "required",
        BIG_INT,
        BIG_FLOAT,
        NEG_BIG,
        "",
    ],
    text_size=12,
    max_leaves=8,
)
DEEP = st.integers(60, 400).map(lambda n: {"json": n})
"""A nesting depth, built as text (a value nested that deep cannot be built by an encoder)."""


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


def _encode(body: Any) -> bytes:
    """`body` as JSON, with the big-number markers and deep-nesting stand-ins written out."""
    deep: list[int] = []

    def mark(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {"json"} and isinstance(value["json"], int) and value["json"] >= 60:
                deep.append(value["json"])
                return f"\x00DEEP{len(deep) - 1}\x00"
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    raw = orjson.dumps(mark(body))
    for marker, text in _BIG_TEXT.items():
        raw = raw.replace(orjson.dumps(marker), text)
    for i, depth in enumerate(deep):
        raw = raw.replace(orjson.dumps(f"\x00DEEP{i}\x00"), _nested(depth))
    return raw


def _with(body: dict[str, Any], path: tuple[Any, ...], value: Any, delete: bool) -> dict[str, Any]:
    """A deep copy of `body` with the field at `path` set to `value` (or deleted)."""
    out = orjson.loads(orjson.dumps(body))
    target: Any = out
    for step in path[:-1]:
        target = target[step]
    if delete:
        target.pop(path[-1]) if isinstance(target, dict) else target.pop(path[-1])
    else:
        target[path[-1]] = value
    return out


# ----------------------------------------------------------------------------- the checks


def _assert_envelope(kind: str, status: int, body: Any) -> None:
    """A 4xx body in the route's own error envelope, with a non-empty message."""
    if kind == "openai":
        assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
        message = body["error"].get("message")
    elif kind == "anthropic":
        assert isinstance(body, dict) and body.get("type") == "error", body
        message = body["error"].get("message")
    elif kind == "google":
        assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
        assert body["error"].get("code") == status, body
        message = body["error"].get("message")
    else:  # the admin API's FastAPI envelope
        assert isinstance(body, dict) and "detail" in body, body
        message = body["detail"]
    assert message, body


def _assert_stream(resp: httpx.Response) -> None:
    """A 200 stream is well formed: SSE events whose data is JSON (or `[DONE]`), or a JSON array."""
    text = resp.text
    if resp.headers["content-type"].startswith("application/json"):
        assert isinstance(orjson.loads(text), list), text[:300]
        return
    for block in filter(None, (b.strip() for b in text.split("\n\n"))):
        # SSE lines end only at CR/LF: str.splitlines would also cut at U+0085 or U+2028 inside JSON.
        lines = [line.rstrip("\r") for line in block.split("\n") if not line.startswith(":")]
        if not lines:
            continue
        if lines[0].startswith("{"):  # a bare error chunk (Google's SDKs need it alone)
            assert "error" in orjson.loads(block), block
            continue
        data = [line[5:].strip() for line in lines if line.startswith("data:")]
        assert data and all(line.startswith(("event:", "data:", "id:")) for line in lines), block
        if data != ["[DONE]"]:
            orjson.loads("\n".join(data))


def _check(fuzzed: dict[str, Any], resp: httpx.Response, envelope: str) -> None:
    bad = fuzzed["catcher"].bad
    assert not bad, bad[:3]
    assert resp.status_code < 500, (resp.status_code, resp.text[:500])
    assert "Traceback" not in resp.text, resp.text[:500]
    if resp.status_code >= 400:
        _assert_envelope(envelope, resp.status_code, resp.json())
    elif (
        resp.headers.get("content-type", "").startswith(("text/event-stream", "application/json"))
        and resp.request.method == "POST"
        and ("stream" in resp.request.url.path.lower() or b'"stream":true' in resp.request.content)
    ):
        _assert_stream(resp)


# ----------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One server for the module (its engine the recorded-vLLM upstream), an open session, clients,
    and the log catcher (checked after each property)."""
    catcher = TracebackCatcher()
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.error", "tapdeck")]
    for logger in loggers:
        logger.addHandler(catcher)
    try:
        with (
            server_with_upstream(tmp_path_factory.mktemp("fuzz") / "data", max_body_bytes=BODY_LIMIT) as (
                up,
                server,
            ),
            httpx.Client(
                base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {server.admin_key}"}
            ) as admin,
        ):
            info = admin.post("/admin/sessions", json={}).json()
            keys = {"x-api-key": info["api_key"], "Authorization": f"Bearer {info['api_key']}"}
            with httpx.Client(base_url=server.url, timeout=60, headers=keys) as model:
                yield {
                    "server": server,
                    "admin": admin,
                    "model": model,
                    "session": info["id"],
                    "catcher": catcher,
                    "upstream": up,
                }
    finally:
        for logger in loggers:
            logger.removeHandler(catcher)


@pytest.fixture
def clean_logs(fuzzed: dict[str, Any]) -> Iterator[None]:
    fuzzed["catcher"].bad.clear()
    yield
    assert not fuzzed["catcher"].bad, fuzzed["catcher"].bad[:5]


def _post(
    fuzzed: dict[str, Any],
    route: tuple[str, str, str, bool],
    content: bytes,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    _name, dialect, path, streams = route
    # The engine here has no /tokenize; once that is known, count requests are only estimated and
    # never translated. Forgotten before each one, so the translation is fuzzed every time.
    aux._no_tokenize.clear()
    return fuzzed["model"].post(
        path, content=content, headers={"Content-Type": "application/json", **(headers or {})}
    )


def _streaming(body: dict[str, Any], route: tuple[str, str, str, bool]) -> dict[str, Any]:
    if route[3] and route[1] in ("chat", "responses", "anthropic"):
        return {**body, "stream": True}
    return body


# ----------------------------------------------------------------------------- model routes


@pytest.mark.medium
@pytest.mark.parametrize("route", ROUTES, ids=[r[0] for r in ROUTES])
@FUZZ
@given(data=st.data())
def test_model_routes_answer_wrongly_typed_fields_in_their_own_envelope(fuzzed, clean_logs, route, data):
    dialect = route[1]
    path = data.draw(st.sampled_from(FIELDS[dialect]), label="field")
    delete = data.draw(st.booleans(), label="delete") if len(path) > 1 else False
    value = data.draw(JSON | DEEP, label="value")
    try:
        body = _with(_streaming(BASES[dialect], route), path, value, delete)
    except (IndexError, KeyError, TypeError):
        return
    _check(fuzzed, _post(fuzzed, route, _encode(body)), ENVELOPE[dialect])


@FUZZ
@given(route=st.sampled_from(ROUTES), value=JSON | DEEP)
def test_model_routes_answer_arbitrary_json_bodies(fuzzed, clean_logs, route, value):
    _check(fuzzed, _post(fuzzed, route, _encode(value)), ENVELOPE[route[1]])


@FUZZ
@given(
    route=st.sampled_from(ROUTES),
    raw=st.binary(max_size=64),
    cut=st.integers(1, 200),
    how=st.sampled_from(["bytes", "truncated", "invalid-utf8", "oversized", "deep"]),
)
def test_model_routes_answer_broken_bytes(fuzzed, clean_logs, route, raw, cut, how):
    valid = _encode(_streaming(BASES[route[1]], route))
    content = {
        "bytes": raw,
        "truncated": valid[: min(cut, len(valid) - 1)],
        "invalid-utf8": valid.replace(b'"Hi"', b'"H\xff\xfei' + raw.replace(b'"', b"") + b'"'),
        "oversized": valid[:-1] + b', "pad": "' + b"x" * (BODY_LIMIT + cut) + b'"}',
        "deep": valid[:-1] + b', "deep": ' + _nested(200 + cut) + b"}",
    }[how]
    resp = _post(fuzzed, route, content)
    _check(fuzzed, resp, ENVELOPE[route[1]])
    assert resp.status_code == {"oversized": 413, "deep": 400, "truncated": 400}.get(how, resp.status_code)


@FUZZ
@given(
    path=st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="?#%\\"), max_size=30),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
)
def test_unknown_paths_are_4xx(fuzzed, clean_logs, path, method):
    resp = fuzzed["model"].request(method, "/v9/" + path.lstrip("/"), content=b"{}")
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text[:300])
    assert "Traceback" not in resp.text


# ----------------------------------------------------------------------------- admin routes

URL_TEXT = st.text(
    st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="/?#%\\"), min_size=1, max_size=20
)
"""Path segments a client can send at all (httpx refuses control characters itself)."""

ADMIN_GETS = [
    "/admin/sessions/{id}",
    "/admin/sessions/{id}/rollout",
    "/admin/sessions/{id}/trace",
    "/admin/sessions/{id}/turns/{seq}",
    "/admin/runs/{id}",
    "/admin/train/{id}",
    "/admin/train/{id}/log",
    "/admin/train/{id}/metrics",
]
ADMIN_POSTS = [
    "/admin/sessions",
    "/admin/runs",
    "/admin/train",
    "/admin/runs/{id}/cancel",
    "/admin/runs/{id}/resume",
    "/admin/runs/{id}/export",
    "/admin/train/{id}/stop",
]
SAFE_ENGINES = st.sampled_from(
    [
        None,
        5,
        "",
        "file:///etc/passwd",
        "ftp://x",
        "http://127.0.0.1:1",
        {"url": "file:///etc/passwd"},
        {"url": "http://u:secret@127.0.0.1:1"},
        {"url": 5},
        {"model": []},
    ]
)
"""Engine fields that can be refused quickly: nothing the fuzzer sends may reach another host."""
SPEC = st.fixed_dictionaries(
    {},
    optional={
        "engine": SAFE_ENGINES,
        "rollout_type": JSON,
        "call_budget": JSON,
        "metadata": JSON | DEEP,
        "alternatives": JSON,
        "training_sampling": JSON,
        "allow_raw_logprobs": JSON,
    },
)
NOT_A_PLAN = st.dictionaries(
    st.sampled_from(["dataset", "tasks", "harness", "sandbox", "engine", "k"]), JSON, max_size=3
).map(lambda d: {**d, "n_tasks": 0})
"""A run plan that cannot validate (n_tasks must be >= 1): the fuzzer must never start a batch."""


@FUZZ
@given(data=st.data())
def test_admin_routes_answer_fuzzed_input_with_4xx_details(fuzzed, clean_logs, data):
    admin: httpx.Client = fuzzed["admin"]
    ident = data.draw(
        URL_TEXT.filter(lambda s: s != fuzzed["session"] and s not in (".", ".."))
        | st.just(fuzzed["session"]),
        label="id",
    )
    seq = data.draw(
        st.integers(-5, 10**30).map(str) | URL_TEXT.filter(lambda s: s not in (".", "..")), label="seq"
    )
    if data.draw(st.booleans(), label="get"):
        path = data.draw(st.sampled_from(ADMIN_GETS), label="path")
        resp = admin.get(path.format(id=ident, seq=seq) if "{" in path else path)
    else:
        path = data.draw(st.sampled_from(ADMIN_POSTS), label="path")
        if path == "/admin/sessions":
            body = _encode(data.draw(SPEC | JSON, label="body"))
        elif path == "/admin/runs":
            body = _encode(data.draw(NOT_A_PLAN | st.lists(JSON, max_size=2), label="body"))
        elif path == "/admin/train":
            body = _encode(
                data.draw(JSON.filter(lambda v: not (isinstance(v, dict) and "recipe" in v)), label="body")
            )
        else:
            body = data.draw(st.binary(max_size=40), label="body")
        resp = admin.post(path.format(id=ident), content=body, headers={"Content-Type": "application/json"})
        if resp.status_code == 200 and path == "/admin/sessions":
            admin.delete(f"/admin/sessions/{resp.json()['id']}")
    if resp.status_code >= 400:
        _check(fuzzed, resp, "admin")
    assert resp.status_code < 500 and "Traceback" not in resp.text, (path, resp.status_code, resp.text[:300])


@pytest.mark.medium
@FUZZ
@given(raw=st.binary(max_size=64), how=st.sampled_from(["bytes", "oversized", "deep", "no-key"]))
def test_admin_bodies_are_capped_and_keyed_before_reading(fuzzed, clean_logs, raw, how):
    server = fuzzed["server"]
    content = {
        "bytes": raw,
        "oversized": b'{"metadata": "' + b"x" * (BODY_LIMIT + 1) + b'"}',
        "deep": b'{"metadata": {"a": ' + _nested(300) + b"}}",
        "no-key": b"x" * (BODY_LIMIT + 1),
    }[how]
    headers = {} if how == "no-key" else {"Authorization": f"Bearer {server.admin_key}"}
    resp = httpx.post(f"{server.url}/admin/sessions", content=content, headers=headers, timeout=60)
    _check(fuzzed, resp, "admin")
    expected = {"oversized": 413, "no-key": 401}.get(how)
    assert resp.status_code == expected if expected else 400 <= resp.status_code < 500
