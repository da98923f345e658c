"""Connection limits against a real tapdeck server, over plain sockets on 127.0.0.1: heads over
their size or line count get a 431 before any key is checked, heads and bodies that stall a 408,
and idle connections are closed. The server runs with small limits (1 s timeouts); every wait
here is bounded, and times are only checked against generous bounds around those limits."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tapdeck.proxy.config import ConnectionLimits
from tests.support.local_server import server_with_upstream

LIMITS = ConnectionLimits(
    max_header_bytes=16 * 1024, max_headers=40, header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=1.0
)
WAIT_S = 10.0
"""The most any one read here waits (the limits are 1 s: far past them on a loaded machine)."""
MODEL_CALL = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with server_with_upstream(tmp_path_factory.mktemp("limits") / "data", connection=LIMITS) as (_up, srv):
        yield srv


def _connect(server) -> socket.socket:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=WAIT_S)


def _send(sock: socket.socket, data: bytes) -> None:
    """Send what the server takes; a server that refused and closed may take less."""
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _reply(sock: socket.socket) -> tuple[bytes, bool]:
    """Everything the server sends until it closes, and whether it closed within WAIT_S."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return data, False
    return data, True


def _one_reply(sock: socket.socket) -> bytes:
    """One response (its head, and a body as long as its Content-Length), leaving the connection."""
    data = b""
    while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length and (chunk := sock.recv(65536)):
        body += chunk
    return head + b"\r\n\r\n" + body


def _status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0


def _body(reply: bytes) -> dict:
    return json.loads(reply.partition(b"\r\n\r\n")[2])


def _head(path: str, *lines: bytes) -> bytes:
    return b"\r\n".join([f"POST {path} HTTP/1.1".encode(), b"Host: tapdeck", *lines, b"", b""])


def test_a_head_at_the_limit_is_served(server):
    """The control: a head just under the byte limit, and one with the most lines, are answered."""
    filler = b"x" * (LIMITS.max_header_bytes - 200)
    with _connect(server) as sock:
        sock.sendall(
            b"GET /health HTTP/1.1\r\nHost: tapdeck\r\nX-Pad: " + filler + b"\r\nConnection: close\r\n\r\n"
        )
        reply, closed = _reply(sock)
    assert _status(reply) == 200 and closed
    lines = [b"X-N%d: 1" % n for n in range(LIMITS.max_headers - 2)]
    with _connect(server) as sock:
        sock.sendall(
            b"\r\n".join([b"GET /health HTTP/1.1", b"Host: tapdeck", *lines, b"Connection: close", b"", b""])
        )
        reply, closed = _reply(sock)
    assert _status(reply) == 200 and closed


@pytest.mark.parametrize("path", ["/health", MODEL_CALL, "/admin/sessions"])
def test_an_oversized_head_is_a_431_before_any_key_is_checked(server, path):
    """A 64 MiB header got a 200 after 6 s and 130 MB of server memory; now the server stops
    reading it past the limit. Unauthenticated model and admin paths get the 431 too, not a 401."""
    with _connect(server) as sock:
        _send(sock, _head(path, b"X-Big: " + b"a" * (4 * 1024 * 1024)))
        reply, closed = _reply(sock)
    assert _status(reply) == 431, reply[:200]
    assert closed
    body = _body(reply)
    assert body["kind"] == "request_header_too_large" and "--max-header-bytes" in body["detail"]
    assert body["retryable"] is False


def test_an_oversized_head_in_one_read_is_a_431(server):
    """A head over the limit that arrives whole with its body (one read) is measured exactly."""
    head = _head(MODEL_CALL, b"X-Big: " + b"a" * (LIMITS.max_header_bytes + 10), b"Content-Length: 2")
    with _connect(server) as sock:
        _send(sock, head + b"{}")
        reply, closed = _reply(sock)
    assert _status(reply) == 431 and closed


def test_too_many_header_lines_are_a_431(server):
    """100,000 headers were accepted; more lines than the limit are refused, however short."""
    lines = [b"X-N%d: 1" % n for n in range(LIMITS.max_headers + 1)]
    with _connect(server) as sock:
        _send(sock, _head(MODEL_CALL, *lines))
        reply, closed = _reply(sock)
    assert _status(reply) == 431 and closed
    assert "header lines" in _body(reply)["detail"] and "--max-headers" in _body(reply)["detail"]


@pytest.mark.medium
def test_a_head_sent_a_byte_at_a_time_is_a_408(server):
    """A byte every few hundred ms kept a connection open for good; the head's clock does not
    restart with each byte."""
    head = _head("/health", b"X-Slow: " + b"s" * 64)
    started = time.monotonic()
    with _connect(server) as sock:
        sent = 0
        try:
            for byte in head:
                sock.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.25)
                if time.monotonic() - started > WAIT_S:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply, closed = _reply(sock)
    assert sent < len(head), "the whole head went through: nothing cut it short"
    assert _status(reply) == 408 and closed
    assert "--header-timeout" in _body(reply)["detail"]
    assert time.monotonic() - started < LIMITS.header_timeout_s + WAIT_S


def test_a_connection_that_sends_nothing_is_closed_without_a_reply(server):
    started = time.monotonic()
    with _connect(server) as sock:
        reply, closed = _reply(sock)
    assert closed and reply == b""
    assert LIMITS.header_timeout_s * 0.5 <= time.monotonic() - started < WAIT_S


def test_a_body_that_stops_short_is_a_408(server):
    """A request announcing 1,000 bytes and sending 12 waited forever (here with the admin key,
    so the server does read its body)."""
    head = _head(
        "/admin/sessions",
        f"Authorization: Bearer {server.admin_key}".encode(),
        b"Content-Type: application/json",
        b"Content-Length: 1000",
    )
    with _connect(server) as sock:
        sock.sendall(head + b'{"metadata":')
        reply, closed = _reply(sock)
    assert _status(reply) == 408 and closed
    assert "--body-timeout" in _body(reply)["detail"]


@pytest.mark.medium
def test_a_body_with_pauses_shorter_than_the_timeout_is_served(server):
    """The body timeout bounds each pause, not the whole body: one that takes longer than the
    timeout in all, but never pauses as long, is read to its end."""
    payload = json.dumps({"metadata": {"pad": "p" * 100}}).encode()
    head = _head(
        "/admin/sessions",
        f"Authorization: Bearer {server.admin_key}".encode(),
        b"Content-Type: application/json",
        b"Content-Length: %d" % len(payload),
        b"Connection: close",
    )
    parts = [payload[i : i + 40] for i in range(0, len(payload), 40)]
    started = time.monotonic()
    with _connect(server) as sock:
        sock.sendall(head)
        for part in parts:
            time.sleep(LIMITS.body_timeout_s * 0.4)
            sock.sendall(part)
        reply, closed = _reply(sock)
    assert time.monotonic() - started > LIMITS.body_timeout_s  # longer than the timeout in all
    assert _status(reply) == 200, reply[:300]
    assert closed


def test_a_connection_idle_after_a_body_sent_past_its_reply_is_closed(server):
    """A model call without a key is answered (401) before its body is read. A client that sends
    the rest of the body afterwards stopped uvicorn's idle clock with those bytes; the connection
    must still close once it idles."""
    head = _head(MODEL_CALL, b"Content-Type: application/json", b"Content-Length: 1000")
    with _connect(server) as sock:
        sock.sendall(head + b"{")
        reply = _one_reply(sock)
        assert _status(reply) == 401
        sock.sendall(b" " * 999)
        started = time.monotonic()
        rest, closed = _reply(sock)
    assert closed and rest == b""
    assert time.monotonic() - started < WAIT_S


def test_an_idle_kept_alive_connection_is_closed(server):
    started = time.monotonic()
    with _connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: tapdeck\r\n\r\n")
        reply, closed = _reply(sock)
    assert _status(reply) == 200 and closed
    assert LIMITS.keep_alive_s * 0.5 <= time.monotonic() - started < WAIT_S


def test_httpx_calls_go_through_under_the_limits(server):
    """An ordinary client's requests are untouched by all of this."""
    with httpx.Client(
        base_url=server.url, timeout=WAIT_S, headers={"Authorization": f"Bearer {server.admin_key}"}
    ) as admin:
        assert admin.get("/health").status_code == 200
        opened = admin.post("/admin/sessions", json={"metadata": {"n": 1}})
        assert opened.status_code == 200, opened.text
        key = opened.json()["api_key"]
    chat = httpx.post(
        f"{server.url}{MODEL_CALL}",
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert chat.status_code == 200, chat.text
