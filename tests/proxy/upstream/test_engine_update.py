"""A weight sync seen from the agent's side, against the fake vLLM going through one as vLLM does:
paused in keep mode (the call is frozen until it resumes) or refusing with its 503 meanwhile."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.fake_vllm import SCALING_503, FakeVllm

CHAT = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
ANTHROPIC = {"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}


def _settles(value: Callable[[], Any], timeout: float = 30.0) -> bool:
    """Whether `value()` turns true within `timeout` (a bound for a loaded machine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value():
            return True
        time.sleep(0.02)
    return bool(value())


class _Call(threading.Thread):
    """One model call made from a thread, as an agent makes it (non-streaming unless `stream`)."""

    def __init__(self, url: str, key: str, body: dict[str, Any], path: str = "/v1/chat/completions") -> None:
        super().__init__(daemon=True)
        self.url, self.key, self.body, self.path = url, key, body, path
        self.reply: httpx.Response | None = None
        self.start()

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}", "x-api-key": self.key}
        self.reply = httpx.post(f"{self.url}{self.path}", json=self.body, headers=headers, timeout=60)

    def result(self) -> httpx.Response:
        self.join(60)
        assert self.reply is not None, "the call did not end"
        return self.reply


def _open(admin: httpx.Client) -> dict[str, Any]:
    resp = admin.post("/admin/sessions", json={})
    assert resp.status_code == 200, resp.text
    return resp.json()


def _chat_requests(engine: FakeVllm) -> int:
    return sum(
        1 for s in engine.sent if s.path.endswith("/chat/completions") and s.body.get("max_tokens") != 1
    )


def test_a_call_held_by_a_paused_engine_is_only_slow(upstream, make_server, admin_for):
    """vLLM paused in keep mode freezes the call: tapdeck neither times it out nor resends it,
    and the agent gets the reply once the engine resumes, recorded as one turn."""
    server = make_server(upstream.base_url)
    admin = admin_for(server)
    info = _open(admin)
    before = _chat_requests(upstream)
    upstream.pause()
    call = _Call(server.url, info["api_key"], CHAT)
    assert _settles(lambda: upstream.held == 1)
    activity = admin.get(f"/admin/sessions/{info['id']}/activity").json()
    assert [c["engine_updating_since"] for c in activity["in_flight"]] == [None]
    assert call.is_alive()
    upstream.resume()
    reply = call.result()
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"]
    assert _chat_requests(upstream) - before == 1
    assert admin.get(f"/admin/sessions/{info['id']}").json()["turns"] == 1


def test_a_held_stream_gets_keepalives_until_the_engine_resumes(upstream, make_server, admin_for):
    server = make_server(upstream.base_url)
    server.service.keepalive_s = 0.05
    info = _open(admin_for(server))
    upstream.pause()
    headers = {"Authorization": f"Bearer {info['api_key']}"}
    with httpx.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        json={**CHAT, "stream": True},
        headers=headers,
        timeout=60,
    ) as resp:
        assert resp.status_code == 200
        chunks = resp.iter_bytes()
        seen = b""
        while seen.count(b": keepalive") < 2:
            seen += next(chunks)
        assert upstream.held == 1
        upstream.resume()
        seen += b"".join(chunks)
    assert b"data: [DONE]" in seen


def test_an_engine_refusing_while_it_updates_is_waited_out_visibly(upstream, make_server, admin_for):
    """A 503 as vLLM answers it while reconfiguring: the call is resent (the Sessions board says
    "engine updating" meanwhile) and the agent gets the reply once the engine serves, one turn."""
    from tapdeck.app.views.sessions import session_state
    from tapdeck.schema.sessions import SessionSummary

    server = make_server(upstream.base_url)
    admin = admin_for(server)
    info = _open(admin)
    sid = info["id"]
    upstream.scaling = True
    call = _Call(server.url, info["api_key"], ANTHROPIC, path="/v1/messages")

    def waiting() -> bool:
        activity = admin.get(f"/admin/sessions/{sid}/activity").json()
        return any(c["engine_updating_since"] is not None for c in activity["in_flight"])

    assert _settles(waiting)
    summary = SessionSummary.model_validate(admin.get(f"/admin/sessions/{sid}").json())
    assert summary.calls_awaiting_engine == 1
    assert session_state(summary) == "engine updating"
    assert _settles(lambda: upstream.refused_scaling >= 2)  # resent, not given up on
    assert call.is_alive()
    upstream.scaling = False
    reply = call.result()
    assert reply.status_code == 200, reply.text
    assert reply.json()["type"] == "message"
    detail = admin.get(f"/admin/sessions/{sid}").json()
    assert detail["turns"] == 1
    assert detail["calls_awaiting_engine"] == 0
    assert not any(f["code"] == "engine_unreachable" for f in detail["findings"])
    activity = admin.get(f"/admin/sessions/{sid}/activity").json()
    assert activity["in_flight"] == [] and activity["errors"] == 0


def test_an_engine_that_recovers_after_some_refusals_answers_once(upstream, make_server, admin_for):
    server = make_server(upstream.base_url)
    admin = admin_for(server)
    info = _open(admin)
    before = _chat_requests(upstream)
    upstream.scaling, upstream.scaling_refusals = True, 3
    reply = _Call(server.url, info["api_key"], CHAT).result()
    assert reply.status_code == 200, reply.text
    assert upstream.refused_scaling == 3  # vLLM's middleware refuses /tokenize too
    assert _chat_requests(upstream) - before >= 2  # resent after a refusal, and served once
    assert admin.get(f"/admin/sessions/{info['id']}").json()["turns"] == 1


@pytest.mark.parametrize(
    "path, body, envelope",
    [
        ("/v1/chat/completions", CHAT, lambda b: b["error"]["message"]),
        ("/v1/messages", ANTHROPIC, lambda b: b["type"] == "error" and b["error"]["message"]),
        (
            "/v1beta/models/m:generateContent",
            {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]},
            lambda b: b["error"]["status"] and b["error"]["message"],
        ),
    ],
)
def test_an_engine_that_never_comes_back_gives_the_agent_its_503(
    upstream, make_server, admin_for, path, body, envelope
):
    server = make_server(upstream.base_url, engine_update_wait_s=0.3)
    admin = admin_for(server)
    info = _open(admin)
    upstream.scaling = True
    reply = _Call(server.url, info["api_key"], body, path=path).result()
    assert reply.status_code == 503
    message = envelope(reply.json())
    assert SCALING_503["error"] in message and "for 0.3 s" in message and "--engine-update-wait" in message
    assert upstream.refused_scaling >= 2
    detail = admin.get(f"/admin/sessions/{info['id']}").json()
    assert detail["turns"] == 0 and detail["calls_awaiting_engine"] == 0


def test_no_wait_passes_the_503_on_at_once(upstream, make_server, admin_for):
    server = make_server(upstream.base_url, engine_update_wait_s=0)
    info = _open(admin_for(server))
    before = _chat_requests(upstream)
    upstream.scaling = True
    reply = _Call(server.url, info["api_key"], CHAT).result()
    assert reply.status_code == 503 and SCALING_503["error"] in reply.json()["error"]["message"]
    assert _chat_requests(upstream) - before == 1
