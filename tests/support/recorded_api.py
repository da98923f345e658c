"""The admin API as recorded from a real server (tests/app/fixtures/api.json), for TUI tests that
must be deterministic: an httpx transport answering from it, and the app over it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from tapdeck.app.client import TapdeckClient

API_FIXTURE = Path(__file__).resolve().parents[1] / "app" / "fixtures" / "api.json"
FROZEN_NOW = 1000.0
"""The clock of an app over the recorded API."""


def recorded_transport(data: dict | None = None) -> httpx.MockTransport:
    """Answers the admin API from `API_FIXTURE`, which `python -m tests.app.record` writes from
    a real server (see tests/app/record.py for the states it drives the server through).

    `graphs` holds each rollout's `GET /admin/sessions/{id}/graph?since=0`; other `since` values get
    the turns from `since` on, as the server answers (tests/schema checks that it does).
    """
    data = data or json.loads(API_FIXTURE.read_text())
    train = data["train"]

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
        if m := re.fullmatch(r"/admin/sessions/([^/]+)/replays?(?:/([^/]+)/logprobs)?", path):
            return _replays(data, request, m[1], m[2])
        if m := re.fullmatch(r"/admin/sessions/([^/]+)/(rollout|activity)", path):
            return _found(data["rollouts" if m[2] == "rollout" else "activity"].get(m[1]), "session")
        if m := re.fullmatch(r"/admin/sessions/([^/]+)", path):
            return _found(data["session_details"].get(m[1]), "session")
        if m := re.fullmatch(r"/admin/sessions/([^/]+)/graph", path):
            view = data["graphs"].get(m[1])
            if view is None:
                return _found(None, "session")
            since = int(request.url.params.get("since", 0))
            return httpx.Response(
                200, json={**view, "since": since, "turns": [t for t in view["turns"] if t["seq"] >= since]}
            )
        if m := re.fullmatch(r"/admin/sessions/([^/]+)/turns/(\d+)", path):
            return _found(data["turns"].get(m[1], {}).get(m[2]), "turn")
        if path == "/admin/engines/version":
            # What a server answers before any trainer posted a version (the recording has none).
            return httpx.Response(200, json=data.get("engine_versions", {"engines": []}))
        if path == "/admin/runs" and request.method == "GET":
            return httpx.Response(200, json={"runs": data["runs"]})
        if m := re.fullmatch(r"/admin/runs/([^/]+)/rollouts/([^/]+)/(processes|agent-output)", path):
            # No rollout runs in the recording: a sandbox only where a test adds one (recorded_sandbox.py).
            doc = data.get("sandboxes", {}).get(m[2], {}).get(m[3])
            if doc is None:
                return httpx.Response(409, json={"detail": f"rollout {m[2]} is not running"})
            return httpx.Response(200, json=doc)
        if m := re.fullmatch(r"/admin/runs/([^/]+)", path):
            return _found(data["run_details"].get(m[1]), "run")
        if path == "/admin/train/recipes":
            return httpx.Response(200, json=train["recipes"])
        if path == "/admin/train" and request.method == "GET":
            return httpx.Response(200, json=train["runs"])
        if m := re.fullmatch(r"/admin/train/([^/]+)/(log|metrics)", path):
            return _found(train["logs" if m[2] == "log" else "metrics"].get(m[1]), "training run")
        if m := re.fullmatch(r"/admin/train/([^/]+)/events", path):
            events = train["events"].get(m[1])
            if events is None:
                return _found(None, "training run")
            body = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
            return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})
        return httpx.Response(404, json={"detail": f"not found: {path}"})

    return httpx.MockTransport(handler)


def _replays(data: dict, request: httpx.Request, session_id: str, replay_id: str | None) -> httpx.Response:
    """The replay routes over `data`'s `replays` (none unless a test adds them:
    tests/support/recorded_replays.py); `POST .../replay` answers `replay_posts`' document and lists
    it from then on, as the server stores it."""
    if session_id not in data["session_details"]:
        return _found(None, "session")
    stored = data.setdefault("replays", {}).setdefault(session_id, [])
    if replay_id is not None:
        return _found(data.get("replay_logprobs", {}).get(replay_id), "replay")
    if request.method == "POST":
        doc = data.get("replay_posts", {}).get(session_id)
        if doc is None:
            return httpx.Response(400, json={"detail": "this server runs no embedded engine"})
        stored.append(doc)
        return httpx.Response(200, json=doc)
    return httpx.Response(200, json={"replays": stored})


def _found(body: dict | None, what: str) -> httpx.Response:
    return (
        httpx.Response(200, json=body)
        if body is not None
        else httpx.Response(404, json={"detail": f"no such {what}"})
    )


def recorded_app(mode: str = "sessions", data: dict | None = None, **kwargs):
    """A TapdeckApp over the recorded API (or `data`, a changed copy of it): no event stream,
    frozen clock, no settings file."""
    from tapdeck.app.tui import TapdeckApp

    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(data))
    return TapdeckApp(
        client,
        server_label="http://tapdeck.test",
        follow_events=False,
        clock=lambda: FROZEN_NOW,
        initial_mode=mode,
        **kwargs,
    )
