"""The stuck-rollout view's server side: `GET /admin/sessions/{id}/activity` over a real server and
a vLLM-shaped engine that never answers."""

from __future__ import annotations

import asyncio

import httpx

from tapdeck.proxy.sessions.activity import CLOSED_KEPT, TEXT_TAIL, ActivityLog, message_view
from tapdeck.schema.activity import SessionActivity
from tests.support.fake_vllm import hanging_engine

CONVERSATION = [
    {"role": "system", "content": "You are a shell agent."},
    {"role": "user", "content": "List the files."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls -la"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "total 8\nhello.txt\nnotes.md"},
]


async def _until(check, what: str, tries: int = 600) -> object:
    for _ in range(tries):
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"never saw {what}")


async def test_activity_shows_the_hung_call_then_its_end_when_the_agent_hangs_up(make_server):
    with hanging_engine() as engine:
        server = make_server(engine.base_url)
        async with httpx.AsyncClient(
            base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {server.admin_key}"}
        ) as admin:
            info = (await admin.post("/admin/sessions", json={})).json()
            sid = info["id"]
            idle = SessionActivity.model_validate((await admin.get(f"/admin/sessions/{sid}/activity")).json())
            assert idle.in_flight == [] and idle.calls_started == 0

            agent = httpx.AsyncClient(timeout=None, headers={"Authorization": f"Bearer {info['api_key']}"})
            call = asyncio.create_task(
                agent.post(
                    f"{info['base_urls']['openai']}/chat/completions",
                    json={"model": "m", "messages": CONVERSATION},
                )
            )

            async def in_flight() -> SessionActivity | None:
                doc = SessionActivity.model_validate(
                    (await admin.get(f"/admin/sessions/{sid}/activity")).json()
                )
                return doc if doc.in_flight and engine.held else None

            doc = await _until(in_flight, "the call in flight")
            assert len(doc.in_flight) == 1
            assert doc.in_flight[0].messages == 4 and doc.in_flight[0].dialect
            assert doc.now >= doc.in_flight[0].started_at
            assert doc.last_observation is not None and doc.last_observation.role == "tool"
            assert doc.last_observation.text.endswith("notes.md")
            assert doc.last_tool_call is not None and doc.last_tool_call.name == "bash"
            assert "ls -la" in doc.last_tool_call.arguments

            call.cancel()  # the agent gives up: the proxy cancels the engine call
            await agent.aclose()

            async def ended() -> SessionActivity | None:
                doc = SessionActivity.model_validate(
                    (await admin.get(f"/admin/sessions/{sid}/activity")).json()
                )
                return doc if not doc.in_flight else None

            doc = await _until(ended, "the call's end")
            assert doc.calls_ended == 1 and doc.errors == 1 and doc.last_ended_at is not None
            assert len(doc.recent_ends) == 1
            assert (await admin.get("/admin/sessions/nope/activity")).status_code == 404


def test_a_reply_becomes_the_last_assistant_message_and_tool_call() -> None:
    log = ActivityLog(clock=lambda: 100.0)
    with log.call("s", {"messages": CONVERSATION}, {"dialect": "openai"}) as call:
        assert log.snapshot("s").in_flight[0].started_at == 100.0
        call.replied(
            {
                "choices": [
                    {
                        "finish_reason": "tool_calls",
                        "message": {
                            "role": "assistant",
                            "content": "Reading it.",
                            "tool_calls": [
                                {"function": {"name": "read_file", "arguments": '{"path": "notes.md"}'}}
                            ],
                        },
                    }
                ]
            }
        )
    doc = log.snapshot("s")
    assert doc.in_flight == [] and doc.calls_ended == 1 and doc.errors == 0
    assert doc.last_assistant is not None and doc.last_assistant.text == "Reading it."
    assert doc.last_tool_call is not None and doc.last_tool_call.name == "read_file"
    assert doc.last_finish_reason == "tool_calls"


def test_a_closed_sessions_activity_stays_readable_only_among_the_newest_closed() -> None:
    log = ActivityLog(clock=lambda: 100.0)
    ids = [f"s{n}" for n in range(CLOSED_KEPT + 1)]
    for sid in ids:
        with log.call(sid, {"messages": CONVERSATION}, {}):
            pass
        log.closed(sid)
    log.closed(ids[-1])  # a second release keeps it where it is
    assert log.snapshot(ids[0]).calls_ended == 0  # forgotten: the oldest closed
    assert [log.snapshot(sid).calls_ended for sid in ids[1:]] == [1] * CLOSED_KEPT
    assert len(log._sessions) + len(log._closed) == CLOSED_KEPT


def test_message_view_keeps_the_tail_of_a_long_observation() -> None:
    text = "head\n" + "x" * TEXT_TAIL + "\nexit code 1"
    view = message_view({"role": "user", "content": [{"type": "text", "text": text}]})
    assert view.truncated and view.text.endswith("exit code 1") and len(view.text) == TEXT_TAIL
    assert not view.text.startswith("head")


def test_a_prompt_whose_tool_calls_are_not_a_list_is_viewed_without_them_not_failed() -> None:
    # A malformed prompt the engine answers anyway (the route fuzz test's input) failed the call
    # with a 500: the activity view iterated `tool_calls` whatever it was.
    log = ActivityLog(clock=lambda: 100.0)
    for odd in (1.5, 60, "call", {"function": {"name": "f"}}):
        prompt = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "x", "tool_calls": odd}]
        with log.call("s", {"messages": prompt}, {}):
            pass
        assert message_view(prompt[1]).tool_calls == [], odd
    assert log.snapshot("s").errors == 0
