"""A session's model call in flight, as the Sessions board learns it: each summary says since when
its oldest unanswered call has waited, and one goes out on `/admin/events` when a call starts and
when a call ends without a turn (a captured turn's own event says it ended)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx

from tapdeck.schema.events import Event, SessionUpdated, TurnCaptured, parse_event
from tapdeck.schema.sessions import SessionSummary

MESSAGES = [{"role": "user", "content": "List the files."}]


async def _follow(server, seen: list[Event]) -> None:
    timeout = httpx.Timeout(10.0, read=None)
    headers = {"Authorization": f"Bearer {server.admin_key}"}
    async with (
        httpx.AsyncClient(base_url=server.url, headers=headers, timeout=timeout) as client,
        client.stream("GET", "/admin/events") as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("data: ") and (event := parse_event(json.loads(line[6:]))) is not None:
                seen.append(event)


async def _until(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw {what}")
        await asyncio.sleep(0.02)


def _summaries(seen: list[Event], sid: str) -> list[SessionSummary]:
    return [e.session for e in seen if isinstance(e, SessionUpdated | TurnCaptured) and e.session.id == sid]


async def test_a_call_in_flight_is_on_the_summary_from_its_start_to_its_end(upstream, make_server):
    upstream.gate = threading.Event()
    server = make_server(upstream.base_url)
    seen: list[Event] = []
    follower = asyncio.create_task(_follow(server, seen))
    admin = httpx.AsyncClient(
        base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {server.admin_key}"}
    )
    try:
        await _until(lambda: server.service.events.subscriber_count == 1, "the event stream")
        info = (await admin.post("/admin/sessions", json={})).json()
        sid, url = info["id"], f"{info['base_urls']['openai']}/chat/completions"
        agent = httpx.AsyncClient(timeout=60, headers={"Authorization": f"Bearer {info['api_key']}"})
        before = time.time()
        answered = asyncio.create_task(agent.post(url, json={"model": "m", "messages": MESSAGES}))
        await _until(upstream.arrived.is_set, "the call at the engine")

        # Held by the engine: the summary went out when the call started, and any read says so.
        await _until(lambda: any(s.calling_since for s in _summaries(seen, sid)), "the call's start")
        started = next(s for s in _summaries(seen, sid) if s.calling_since)
        assert started.turns == 0 and started.calling_since is not None
        assert before <= started.calling_since <= time.time()
        await asyncio.sleep(0.3)
        listed = SessionSummary.model_validate((await admin.get(f"/admin/sessions/{sid}")).json())
        assert listed.calling_since == started.calling_since
        assert listed.seconds_calling is not None and listed.seconds_calling >= 0.3

        # Answered: the turn's own event says no call is in flight any more.
        upstream.gate.set()
        assert (await answered).status_code == 200
        await _until(lambda: any(isinstance(e, TurnCaptured) for e in seen), "the captured turn")
        captured = next(e for e in seen if isinstance(e, TurnCaptured))
        assert captured.session.turns == 1
        assert (captured.session.calling_since, captured.session.seconds_calling) == (None, None)

        # A call whose caller hangs up ends without a turn: a summary says so all the same.
        upstream.gate.clear()
        upstream.arrived.clear()
        count = len(_summaries(seen, sid))
        hung = asyncio.create_task(agent.post(url, json={"model": "m", "messages": MESSAGES}))
        await _until(upstream.arrived.is_set, "the second call at the engine")
        await _until(lambda: _summaries(seen, sid)[-1].calling_since is not None, "the second call's start")
        hung.cancel()
        await _until(
            lambda: (
                len(_summaries(seen, sid)) > count + 1 and _summaries(seen, sid)[-1].calling_since is None
            ),
            "the hung-up call's end",
        )
        assert _summaries(seen, sid)[-1].turns == 1
        listed = SessionSummary.model_validate((await admin.get(f"/admin/sessions/{sid}")).json())
        assert (listed.calling_since, listed.seconds_calling) == (None, None)
        await agent.aclose()
    finally:
        upstream.gate.set()
        follower.cancel()
        await admin.aclose()
