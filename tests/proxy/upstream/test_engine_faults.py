"""Engine faults against a real server and a misbehaving loopback engine: each ends in a non-empty
error in the caller's dialect, leaks no pool slot or task, and never shows engine credentials."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import struct
import threading
import time

import httpx
import pytest

from tapdeck.proxy.upstream.address import EngineAddressError, shown_url

CHAT = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
ANTHROPIC = {"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}


def _open(admin: httpx.Client, **spec) -> dict:
    resp = admin.post("/admin/sessions", json=spec)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _pending_tasks() -> int:
    """Unfinished asyncio tasks in this process (the server's loop and the upstream's)."""
    return sum(1 for o in gc.get_objects() if isinstance(o, asyncio.Task) and not o.done())


def _settles(value, expected, timeout: float = 30.0) -> bool:
    """Whether `value()` reaches `expected` within `timeout` (a bound for a loaded machine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value() == expected:
            return True
        time.sleep(0.05)
    return value() == expected


def _engine_in_flight(server) -> int:
    return sum(client.in_flight for client in server.service._clients.values())


@pytest.mark.parametrize(
    "mode, status, words",
    [
        ("truncated_json", 502, "not a JSON object"),
        ("no_choices", 502, "without choices"),
        ("html", 502, "not a JSON object"),
    ],
)
def test_broken_engine_replies_are_502s_with_a_message_in_every_dialect(
    upstream, make_server, admin_for, mode, status, words
):
    server = make_server(upstream.base_url)
    info = _open(admin_for(server))
    upstream.fault = mode
    key = {"Authorization": f"Bearer {info['api_key']}", "x-api-key": info["api_key"]}
    chat = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers=key, timeout=60)
    assert chat.status_code == status and words in chat.json()["error"]["message"]
    messages = httpx.post(f"{server.url}/v1/messages", json=ANTHROPIC, headers=key, timeout=60)
    assert messages.status_code == status and messages.json()["type"] == "error"
    assert words in messages.json()["error"]["message"]
    google = httpx.post(
        f"{server.url}/v1beta/models/m:generateContent",
        headers=key,
        timeout=60,
        json={"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]},
    )
    assert google.status_code == status and words in google.json()["error"]["message"]
    assert _engine_in_flight(server) == 0


class _Link:
    """A TCP forwarder standing for the engine's process: `kill()` resets every connection and
    closes the port, as the kernel does when an engine is killed mid-call."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept(): the port stops answering
        self.listener.close()
        for conn in self.conns:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)  # wakes the forwarding thread blocked on it
            conn.close()


def test_engine_killed_mid_call_is_a_502_and_frees_its_slot(upstream, make_server, admin_for):
    link = _Link(upstream.port)
    server = make_server(f"http://127.0.0.1:{link.port}/v1")
    admin = admin_for(server)
    info = _open(admin)
    upstream.delay = 60.0
    result: dict = {}

    def call() -> None:
        result["resp"] = httpx.post(
            f"{server.url}/v1/chat/completions",
            json=CHAT,
            timeout=120,
            headers={"Authorization": f"Bearer {info['api_key']}"},
        )

    before = len(upstream.requests)  # the probe's
    caller = threading.Thread(target=call)
    caller.start()
    assert _settles(lambda: len(upstream.requests), before + 1)
    link.kill()  # the engine dies with the call in flight
    caller.join(120)
    resp = result["resp"]
    assert resp.status_code == 502
    assert resp.json()["error"]["type"] == "unreachable" and resp.json()["error"]["message"]
    assert _engine_in_flight(server) == 0
    assert server.service._sessions[info["id"]].in_flight == 0
    assert admin.get(f"/admin/sessions/{info['id']}").json()["turns"] == 0


def test_engine_hang_past_the_timeout_frees_its_slot(upstream, make_server, admin_for):
    server = make_server(upstream.base_url)
    server.service.engine_timeout = 0.3
    info = _open(admin_for(server))
    upstream.delay = 5.0
    resp = httpx.post(
        f"{server.url}/v1/messages",
        json={**ANTHROPIC, "stream": True},
        timeout=60,
        headers={"x-api-key": info["api_key"]},
    )
    # A stream whose engine already failed gets its real status (held until the first keepalive).
    assert resp.status_code == 502 and resp.json()["type"] == "error"
    assert "timed out" in resp.json()["error"]["message"]
    assert _engine_in_flight(server) == 0
    assert server.service._sessions[info["id"]].in_flight == 0


@pytest.mark.medium
def test_client_leaving_mid_stream_keeps_the_turn_and_leaks_nothing(upstream, make_server, admin_for):
    server = make_server(upstream.base_url)
    admin = admin_for(server)
    info = _open(admin)
    upstream.fault = "long"  # a reply far larger than socket buffers: the client leaves mid-write
    key = {"Authorization": f"Bearer {info['api_key']}"}
    warm = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers=key, timeout=120)
    assert warm.status_code == 200
    baseline = _pending_tasks()
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST", f"{server.url}/v1/chat/completions", json={**CHAT, "stream": True}, headers=key
        ) as stream,
    ):
        first = next(stream.iter_bytes())
        assert first
    assert _settles(lambda: admin.get(f"/admin/sessions/{info['id']}").json()["turns"], 2)
    assert _settles(_pending_tasks, baseline)
    assert _engine_in_flight(server) == 0
    assert server.service._sessions[info["id"]].in_flight == 0


def test_engine_credentials_never_reach_an_error_message(upstream, make_server, admin_for):
    host = upstream.base_url.removeprefix("http://")
    server = make_server(f"http://tapdeck:s3cret-pass@{host}")
    info = _open(admin_for(server))
    upstream.stop()
    resp = httpx.post(
        f"{server.url}/v1/chat/completions",
        json=CHAT,
        timeout=60,
        headers={"Authorization": f"Bearer {info['api_key']}"},
    )
    assert resp.status_code == 502
    message = resp.json()["error"]["message"]
    assert message and "s3cret-pass" not in message and "***@" in message


def test_shown_url_hides_userinfo_and_key_parameters():
    assert shown_url("engine at https://u:p@h:1/v1 failed") == "engine at https://***@h:1/v1 failed"
    assert shown_url("http://h/v1?key=abc&x=1") == "http://h/v1?key=***&x=1"
    assert shown_url("http://h:8000/v1") == "http://h:8000/v1"


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.org/v1", "gopher://h:70"])
def test_non_http_engine_urls_are_refused(upstream, make_server, admin_for, url):
    server = make_server(upstream.base_url)
    resp = admin_for(server).post("/admin/sessions", json={"engine": {"url": url}})
    assert resp.status_code == 400 and "http" in resp.json()["detail"]
    with pytest.raises(EngineAddressError) as err:
        make_server(url)
    assert err.value.status == 400


def test_a_tapdeck_failure_after_the_engine_answered_is_a_500_in_the_callers_dialect(
    upstream, make_server, admin_for, monkeypatch, caplog
):
    # A bug in rendering a reply must still reach the agent's SDK as its own error (plain
    # streaming included), not uvicorn's bare text 500 or a cut stream; the turn stays recorded.
    import anthropic

    from tapdeck.proxy.dialects.anthropic import DIALECT

    def broken(*_args, **_kwargs):
        raise RuntimeError("render broke")

    monkeypatch.setattr(DIALECT, "render", broken)
    monkeypatch.setattr(DIALECT, "render_stream", broken)
    server = make_server(upstream.base_url)
    admin = admin_for(server)
    info = _open(admin)
    client = anthropic.Anthropic(
        base_url=info["base_urls"]["anthropic"], api_key=info["api_key"], max_retries=0
    )
    with pytest.raises(anthropic.InternalServerError) as err:
        client.messages.create(**ANTHROPIC)
    assert err.value.body["error"]["type"] == "api_error"
    assert "RuntimeError: render broke" in err.value.message and "tapdeck bug" in err.value.message
    assert "recorded as turn 0" in err.value.message
    with pytest.raises(anthropic.APIStatusError) as streamed:
        list(client.messages.create(**ANTHROPIC, stream=True))
    assert "render broke" in streamed.value.message
    assert admin.get(f"/admin/sessions/{info['id']}").json()["turns"] == 2
    assert "render broke" in caplog.text


@pytest.mark.medium
def test_a_tapdeck_failure_before_the_turn_is_recorded_ends_a_started_stream_with_an_error_event(
    upstream, make_server, admin_for, monkeypatch
):
    # The engine is slower than the stream's hold, so the stream has started (200, a keepalive)
    # when the capture fails: the agent still gets its dialect's error event, saying nothing was kept.
    import anthropic

    from tapdeck.proxy.capture import call as call_capture

    def broken(*_args, **_kwargs):
        raise RuntimeError("capture broke")

    monkeypatch.setattr(call_capture, "_cap_findings", broken)
    server = make_server(upstream.base_url)
    server.service.keepalive_s = 0.05
    admin = admin_for(server)
    info = _open(admin)
    upstream.delay = 0.5
    client = anthropic.Anthropic(
        base_url=info["base_urls"]["anthropic"], api_key=info["api_key"], max_retries=0
    )
    with pytest.raises(anthropic.APIStatusError) as streamed:
        list(client.messages.create(**ANTHROPIC, stream=True))
    assert "RuntimeError: capture broke" in streamed.value.message
    assert "no turn of it was recorded" in streamed.value.message
    assert admin.get(f"/admin/sessions/{info['id']}").json()["turns"] == 0
