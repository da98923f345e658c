"""The TUI attached to a real server holding 1,000 sessions, 256 of them live: the counts, a
filter's rows, a sort's order and stuck first are right at that size. Correctness, not time:
bench/tui.py times the same keys (and fills the server with the same `populate`)."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from pathlib import Path

import httpx
import pytest
from textual.widgets import Static

from tapdeck.app.client import TapdeckClient
from tapdeck.app.tui import TapdeckApp
from tapdeck.app.widgets.session_table import SessionTable
from tapdeck.schema.sessions import SessionList
from tests.support.pilot_wait import until

_spec = importlib.util.spec_from_file_location("bench_tui", Path(__file__).parents[2] / "bench" / "tui.py")
assert _spec is not None and _spec.loader is not None
bench_tui = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_tui)

SESSIONS, LIVE = 1000, 256
WAIT_S = 120.0  # a bound for 2 shared cores, not a speed check
MESSAGES = [{"role": "user", "content": "List the files."}]


def _keys(table: SessionTable) -> list[str]:
    return [row.key.value or "" for row in table.ordered_rows]


async def _call(server_url: str, api_key: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=120, headers={"Authorization": f"Bearer {api_key}"}) as agent:
        return await agent.post(
            f"{server_url}/v1/chat/completions", json={"model": "m", "messages": MESSAGES}
        )


@pytest.mark.medium
async def test_counts_filter_sort_and_stuck_first_are_right_at_a_thousand_sessions(
    upstream, make_server, tmp_path
):
    upstream.gate = threading.Event()
    upstream.gate.set()
    server = make_server(upstream.base_url)
    # Closed sessions after 0, 1 or 2 calls; live ones with none yet (this test makes theirs).
    filled = await bench_tui.populate(
        server.url, server.admin_key, sessions=SESSIONS, live=LIVE, long_turns=0, closed_calls=2, live_calls=0
    )
    ids: list[str] = filled["ids"]
    keys = {sid: key for sid, key, _messages in filled["live"]}
    live = [ids[i] for i in range(SESSIONS - LIVE, SESSIONS)]
    # The stuck-first cast: `oldest` calls first, then `later` one by one, then `waiting`'s call
    # is held by the engine.
    oldest, *later, waiting = live[:6]
    assert (await _call(server.url, keys[oldest])).status_code == 200
    await asyncio.sleep(1.0)
    for sid in later:
        assert (await _call(server.url, keys[sid])).status_code == 200
        await asyncio.sleep(0.3)

    app = TapdeckApp(
        TapdeckClient(server.url, server.admin_key),
        settings_path=tmp_path / "tui.json",
        initial_mode="sessions",
    )
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == SESSIONS, "every session's row", WAIT_S)
        summary = app.screen.query_one("#sessions-summary", Static)
        assert str(summary.render()) == "1000 sessions · 744 finished · 251 no call yet · 5 running"

        # A filter keeps exactly the rows it names, and a second word narrows them.
        await pilot.press("slash", *"task-007")
        task_7 = [ids[i] for i in range(SESSIONS) if i % bench_tui.TASKS == 7]
        await until(pilot, lambda: sorted(_keys(table)) == sorted(task_7), "task-007's rows")
        await pilot.press(*" state:no", "enter")
        await until(
            pilot,
            lambda: sorted(_keys(table)) == sorted(sid for sid in task_7 if sid in live[6:]),
            "task-007's live rows",
        )
        await pilot.press("escape")
        await until(pilot, lambda: table.row_count == SESSIONS, "every row again")

        # Sorts: calls, then reward, each largest first and whole.
        listed = SessionList.model_validate(
            httpx.get(
                f"{server.url}/admin/sessions", headers={"Authorization": f"Bearer {server.admin_key}"}
            ).json()
        ).sessions
        turns = {s.id: s.turns for s in listed}
        rewards = {s.id: s.metadata.get("reward") for s in listed}
        await pilot.press("s", "s")
        assert app.screen.view.sort == "calls"
        await until(
            pilot,
            lambda: [turns[k] for k in _keys(table)] == sorted(turns.values(), reverse=True),
            "the rows by calls",
        )
        assert sorted(_keys(table)) == sorted(ids)
        await pilot.press("s", "s")
        assert app.screen.view.sort == "reward"
        known = sorted((r for r in rewards.values() if r is not None), reverse=True)
        await until(
            pilot,
            lambda: [rewards[k] for k in _keys(table)] == known + [None] * (SESSIONS - len(known)),
            "the rows by reward, live ones (none yet) last",
        )

        # Stuck first: the call the engine holds, then the longest idle, and so on.
        upstream.gate.clear()
        upstream.arrived.clear()
        held = asyncio.create_task(_call(server.url, keys[waiting]))
        await until(pilot, upstream.arrived.is_set, "the held call at the engine", WAIT_S)
        await pilot.press("exclamation_mark")
        await until(pilot, lambda: _keys(table)[:6] == [waiting, oldest, *later], "stuck first", WAIT_S)
        await until(
            pilot, lambda: str(table.get_cell(waiting, "state")).startswith("calling "), "its calling cell"
        )
        upstream.gate.set()
        assert (await held).status_code == 200
        # Answered: now the one that called last, so the last of the live rows with a call.
        await until(pilot, lambda: _keys(table)[:6] == [oldest, *later, waiting], "the answered call", WAIT_S)
        assert str(table.get_cell(waiting, "state")) == "running"
