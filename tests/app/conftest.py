"""Fixtures for the TUI tests: an App over a recorded API (deterministic), or over a real LocalServer."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import httpx
import pytest

from tapdeck.app.client import TapdeckClient
from tapdeck.proxy.activity import ActivityLog

API_FIXTURE = Path(__file__).parent / "fixtures" / "api.json"
FROZEN_NOW = 1000.0
ACTIVITY_NOW = 1700000300.0
"""The recorded server's wall clock when it answers an activity request."""


def recorded_transport(data: dict | None = None) -> httpx.MockTransport:
    """Answers the admin API from `fixtures/api.json`.

    The bodies were recorded from a real LocalServer (embedded engine, an oracle batch and two chat
    sessions), with ids, ports and times normalised; four sessions and one failed rollout are copies
    of recorded ones with other `phase`/turn values, so every state appears. `graphs` holds each
    recorded rollout's `GET /admin/sessions/{id}/graph` view (answered for any `since`).
    """
    data = data or json.loads(API_FIXTURE.read_text())

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200, json=data["health"])
        if request.headers.get("authorization") != "Bearer test-key":
            return httpx.Response(401, json={"detail": "admin key required"})
        if path == "/admin/catalog":
            return httpx.Response(200, json=data["catalog"])
        if path == "/admin/sessions":
            return httpx.Response(200, json={"sessions": data["sessions"]})
        if m := re.fullmatch(r"/admin/sessions/([^/]+)/rollout", path):
            doc = data["rollouts"].get(m[1])
            return httpx.Response(200, json=doc) if doc else httpx.Response(404, json={"detail": "no such session"})
        if m := re.fullmatch(r"/admin/sessions/([^/]+)", path):
            found = [s for s in data["sessions"] if s["id"] == m[1]]
            doc = data["rollouts"].get(m[1]) or {}
            return httpx.Response(200, json={**found[0], "findings": doc.get("findings", [])}) if found \
                else httpx.Response(404, json={"detail": "no such session"})
        if m := re.fullmatch(r"/admin/sessions/([^/]+)/activity", path):
            turns = data["turns"].get(m[1])
            return httpx.Response(200, json=recorded_activity(m[1], turns)) if turns else \
                httpx.Response(404, json={"detail": "no such session"})
        if m := re.fullmatch(r"/admin/sessions/([^/]+)/graph", path):
            view = data["graphs"].get(m[1])
            if view is None:
                return httpx.Response(404, json={"detail": "no such session"})
            since = int(request.url.params.get("since", 0))
            return httpx.Response(200, json={**view, "since": since,
                                             "turns": [t for t in view["turns"] if t["seq"] >= since]})
        if m := re.fullmatch(r"/admin/sessions/([^/]+)/turns/(\d+)", path):
            turn = data["turns"].get(m[1], {}).get(m[2])
            return httpx.Response(200, json=turn) if turn else httpx.Response(404, json={"detail": "no such turn"})
        if path == "/admin/runs" and request.method == "GET":
            return httpx.Response(200, json={"runs": data["runs"]})
        if m := re.fullmatch(r"/admin/runs/([^/]+)", path):
            return httpx.Response(200, json=data["run_details"][m[1]])
        return httpx.Response(404, json={"detail": f"not found: {path}"})

    return httpx.MockTransport(handler)


def recorded_activity(session_id: str, turns: dict[str, dict]) -> dict:
    """The session's activity as the proxy's own ActivityLog builds it from the recorded turns:
    each turn's request and reply in order, then the last request again, in flight for 75 s."""
    clock = [ACTIVITY_NOW - 110.0]
    log = ActivityLog(clock=lambda: clock[0])
    ordered = [turns[k] for k in sorted(turns, key=int)]
    for turn in ordered:
        with log.call(session_id, turn["request"], {"dialect": "openai"}) as call:
            clock[0] += 5.0
            call.replied({"choices": [{"message": turn["response"], "finish_reason": turn["finish_reason"]}]})
    with contextlib.ExitStack() as hung:
        clock[0] = ACTIVITY_NOW - 75.0
        hung.enter_context(log.call(session_id, ordered[-1]["request"], {"dialect": "openai"}))
        clock[0] = ACTIVITY_NOW
        return log.snapshot(session_id).model_dump(mode="json")


def recorded_app(mode: str = "sessions", **kwargs):
    """A TapdeckApp over the recorded API: no event stream, frozen clock, no settings file."""
    from tapdeck.app.tui import TapdeckApp

    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport())
    return TapdeckApp(client, server_label="http://tapdeck.test", follow_events=False,
                      clock=lambda: FROZEN_NOW, initial_mode=mode, **kwargs)


@pytest.fixture
def api_data() -> dict:
    return json.loads(API_FIXTURE.read_text())


@pytest.fixture
def make_app():
    """`make_app(mode, **kwargs)` → a TapdeckApp over the recorded API."""
    return recorded_app
