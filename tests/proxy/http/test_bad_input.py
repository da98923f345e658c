"""Bad input against a real server: bodies capped and keyed before they are read, wrongly typed
fields and deep nesting answered as 4xx in the caller's own envelope (the shapes of issue 10)."""

from __future__ import annotations

import socket

import httpx
import pytest
from starlette.requests import Request

from tapdeck.proxy.http.limits import (
    MAX_JSON_DEPTH,
    BodyIncomplete,
    BodyTooLarge,
    read_body,
    too_deep,
)
from tests.support.local_server import server_with_upstream

NESTED = "[" * 300 + "1" + "]" * 300
CASES = [
    # (path, body) — each was a plain-text 500 with a traceback
    (
        "/v1/messages",
        '{"model":"m","max_tokens":4,"messages":[{"role":"user","content":[{"type":"text","text":5}]}]}',
    ),
    (
        "/v1/messages",
        '{"model":"m","max_tokens":4,"system":[{"text":7}],"messages":[{"role":"user","content":"hi"}]}',
    ),
    ("/v1/messages", '{"model":"m","max_tokens":4,"tools":5,"messages":[{"role":"user","content":"hi"}]}'),
    (
        "/v1/messages",
        '{"model":"m","max_tokens":4,"stop_sequences":5,"messages":[{"role":"user","content":"hi"}]}',
    ),
    (
        "/v1/messages",
        '{"model":"m","max_tokens":4,"output_config":"x","messages":[{"role":"user","content":"hi"}]}',
    ),
    (
        "/v1/messages/count_tokens",
        '{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":5}]}]}',
    ),
    ("/v1beta/models/m:generateContent", '{"contents":[{"role":"user","parts":["hi"]}]}'),
    (
        "/v1beta/models/m:generateContent",
        '{"systemInstruction":[{"text":"s"}],"contents":[{"role":"user","parts":[{"text":"hi"}]}]}',
    ),
    ("/v1/responses", '{"model":"m","input":"hi","tools":[5]}'),
    ("/v1/responses", '{"model":"m","input":[{"role":"user","content":[5]}]}'),
    (
        "/v1/chat/completions",
        '{"model":"m","messages":[{"role":"user","content":"hi"}],"deep":' + NESTED + "}",
    ),
    (
        "/v1/chat/completions",
        '{"model":"m","stream":true,"messages":[{"role":"user","content":' + NESTED + "}]}",
    ),
    (
        "/v1/messages",
        '{"model":"m","max_tokens":4,"stream":true,"messages":[{"role":"user","content":' + NESTED + "}]}",
    ),
    ("/v1/chat/completions", b'{"model":"m","messages":[{"role":"user","content":"\xff\xfe"}]}'),
    ("/v1/chat/completions", '{"model":"m","messages":[{"role":"user","con'),
]


def _open(admin: httpx.Client) -> dict:
    resp = admin.post("/admin/sessions", json={})
    assert resp.status_code == 200, resp.text
    return resp.json()


def _message(path: str, body: dict) -> str:
    if "/messages" in path:
        assert body["type"] == "error"
    return body["error"]["message"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with (
        server_with_upstream(tmp_path_factory.mktemp("bad-input") / "data", max_body_bytes=4096) as (
            _up,
            server,
        ),
        httpx.Client(
            base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {server.admin_key}"}
        ) as admin,
    ):
        yield server, _open(admin)


@pytest.mark.parametrize("path, body", CASES)
def test_wrongly_typed_deep_or_broken_bodies_are_400s_in_the_callers_envelope(served, path, body):
    server, info = served
    resp = httpx.post(
        f"{server.url}{path}",
        content=body,
        timeout=60,
        headers={"x-api-key": info["api_key"], "Authorization": f"Bearer {info['api_key']}"},
    )
    assert resp.status_code == 400, resp.text
    assert "Traceback" not in resp.text and _message(path, resp.json())
    assert sum(c.in_flight for c in server.service._clients.values()) == 0
    assert server.service._sessions[info["id"]].in_flight == 0


@pytest.mark.parametrize(
    "path, envelope",
    [
        ("/v1/chat/completions", "openai"),
        ("/v1/responses", "openai"),
        ("/v1/messages", "anthropic"),
        ("/v1beta/models/m:generateContent", "google"),
    ],
)
def test_oversized_body_is_413_in_the_callers_envelope(served, path, envelope):
    server, info = served
    resp = httpx.post(
        f"{server.url}{path}",
        content=b'{"pad":"' + b"x" * 5000 + b'"}',
        timeout=60,
        headers={"x-api-key": info["api_key"], "Authorization": f"Bearer {info['api_key']}"},
    )
    assert resp.status_code == 413
    assert "at most 4096 bytes" in _message(path, resp.json())
    if envelope == "google":
        assert resp.json()["error"]["code"] == 413


def _raw(server, head: str, body: bytes = b"") -> bytes:
    """Send a request by hand (the body as given, perhaps far shorter than declared) and read the
    answer: it comes without the server waiting for a body it will not read."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
        return answer


def _length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def test_keys_are_checked_and_declared_sizes_refused_before_any_body_is_read(served):
    server, info = served
    huge = "Content-Length: 100000000\r\nContent-Type: application/json\r\n"
    no_key = _raw(server, f"POST /v1/messages HTTP/1.1\r\nHost: x\r\n{huge}")
    assert no_key.startswith(b"HTTP/1.1 401") and b'"authentication_error"' in no_key
    keyed = _raw(server, f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {info['api_key']}\r\n{huge}")
    assert keyed.startswith(b"HTTP/1.1 413") and b'"type":"error"' in keyed
    admin = _raw(server, f"POST /admin/sessions HTTP/1.1\r\nHost: x\r\n{huge}")
    assert admin.startswith(b"HTTP/1.1 401")
    admin = _raw(
        server,
        f"POST /admin/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.admin_key}\r\n{huge}",
    )
    assert admin.startswith(b"HTTP/1.1 413")


def test_a_chunked_body_is_cut_off_once_past_the_limit(served):
    server, info = served
    chunk = b"x" * 1000
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(6))  # 6000 bytes, no end
    answer = _raw(
        server,
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {info['api_key']}\r\nTransfer-Encoding: chunked\r\n",
        body,
    )
    assert answer.startswith(b"HTTP/1.1 413") and b"at most 4096 bytes" in answer


def _request(*messages: dict) -> Request:
    """A model-call request whose ASGI channel delivers `messages`, in order."""
    queue = list(messages)

    async def receive() -> dict:
        return queue.pop(0)

    return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}, receive)


async def test_a_body_in_parts_is_read_whole_and_a_client_leaving_mid_body_is_refused():
    parts = [
        {"type": "http.request", "body": b'{"model":', "more_body": True},
        {"type": "http.request", "body": b"", "more_body": True},
        {"type": "http.request", "body": b'"m"}', "more_body": False},
    ]
    assert await read_body(_request(*parts), 100) == b'{"model":"m"}'
    with pytest.raises(BodyTooLarge):
        await read_body(_request(*parts), 12)
    with pytest.raises(BodyIncomplete):
        await read_body(_request(parts[0], {"type": "http.disconnect"}), 100)


def _nested(levels: int) -> object:
    """`levels` containers deep, alternating objects and arrays, with shallower siblings."""
    value: object = ["x", 1]
    for i in range(1, levels):
        value = {"a": "x", "b": value, "c": [1, 2]} if i % 2 else ["x", value, {"c": 1}]
    return value


@pytest.mark.parametrize("limit", [1, 2, 7, MAX_JSON_DEPTH])
def test_nesting_limit_counts_containers_exactly(limit):
    assert not too_deep(_nested(limit), limit)
    assert too_deep(_nested(limit + 1), limit)
    assert too_deep({"ok": [1], "deep": _nested(limit)}, limit)
    assert not too_deep("scalar", 0) and not too_deep(5, 0)
