"""The TUI driven against a REAL tapdeck server (LocalServer + the embedded engine), over HTTP/SSE."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from textual.widgets import DataTable, Select, SelectionList

from tapdeck.app.client import TapdeckClient
from tapdeck.app.tui import TapdeckApp
from tapdeck.app.views.sessions import session_state
from tapdeck.app.widgets.rollout_tree import RolloutTree
from tapdeck.app.widgets.session_table import SessionTable
from tapdeck.app.widgets.token_view import TokenView
from tests.support.local_server import local_server_on
from tests.support.pilot_wait import click_until, until

WAIT_S = 120.0  # a generous bound for a rollout to finish on 2 shared cores (not a speed check)


@pytest.fixture(scope="module")
def live_server(embedded_engine, tmp_path_factory) -> Iterator[object]:
    """A full LocalServer (capture proxy, admin API, runner routes) using the shared embedded engine."""
    with local_server_on(embedded_engine, tmp_path_factory.mktemp("tapdeck-data")) as server:
        yield server


def _app(server, mode: str, tmp_path: Path) -> TapdeckApp:
    return TapdeckApp(
        TapdeckClient(server.url, server.admin_key), settings_path=tmp_path / "tui.json", initial_mode=mode
    )


def _states(table: SessionTable) -> list[str]:
    return [str(table.get_cell(row, "state")) for row in table.rows]


async def _start_batch(pilot, harness: str, task: str) -> None:
    app = pilot.app
    screen = app.screen
    await until(pilot, lambda: screen.catalog is not None, "the catalog", 60)
    assert screen.query_one("#dataset", Select).value == "sample"
    screen.query_one("#harness", Select).value = harness
    tasks = screen.query_one("#tasks", SelectionList)
    await until(pilot, lambda: task in [option.value for option in tasks.options], "the task list", WAIT_S)
    tasks.select(task)
    await pilot.pause(0.1)
    assert tasks.selected == [task]
    assert "✓" in str(screen.query_one("#why-harness").render())
    await pilot.press("ctrl+s")
    await until(pilot, lambda: app.current_mode == "sessions", "the switch to Sessions", 60)


@pytest.mark.medium
async def test_oracle_batch_reaches_finished_and_run_exports(live_server, tmp_path):
    app = _app(live_server, "setup", tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await _start_batch(pilot, "oracle", "hello-file")
        table = app.screen.query_one(SessionTable)
        await until(
            pilot,
            lambda: "finished" in _states(table) or "failed" in _states(table),
            "the oracle rollout to end",
            WAIT_S,
        )
        assert "finished" in _states(table), app.status
        await pilot.press("4")
        await until(
            pilot,
            lambda: app.screen.query_one("#groups-table", DataTable).row_count == 1,
            "the run's group",
            WAIT_S,
        )
        groups = app.screen.query_one("#groups-table", DataTable)
        assert str(groups.get_row_at(0)[0]) == "hello-file"
        await pilot.press("e")
        await until(pilot, lambda: any("wrote" in n.message for n in app._notifications), "the export", 60)
        path = next(n.message for n in app._notifications if "wrote" in n.message).split("wrote ", 1)[1]
        assert Path(path).is_file()


async def _open_rollout(pilot, session_id: str) -> None:
    """Wait for the session's row on Sessions, open its rollout, wait for its first turn."""
    app = pilot.app
    table = app.screen.query_one(SessionTable)
    await until(pilot, lambda: session_id in [r.value for r in table.rows], "the session row", 30)
    app.open_rollout(session_id)
    # query, not query_one: the mode switches before the Rollout screen has composed.
    await until(
        pilot,
        lambda: (
            app.current_mode == "rollout" and any(v.turn is not None for v in app.screen.query(TokenView))
        ),
        "turn 0",
        30,
    )


@pytest.mark.medium
async def test_live_session_rollout_grows_and_a_token_can_be_selected(live_server, tmp_path):
    admin = {"Authorization": f"Bearer {live_server.admin_key}"}
    async with httpx.AsyncClient(base_url=live_server.url, timeout=120) as http:
        info = (
            await http.post("/admin/sessions", json={"metadata": {"task": "pilot-chat"}}, headers=admin)
        ).json()
        key = {"Authorization": f"Bearer {info['api_key']}"}
        messages = [{"role": "user", "content": "Say hello."}]
        body = {"model": "any", "messages": messages, "max_tokens": 12, "temperature": 1.0}
        first = (await http.post("/v1/chat/completions", json=body, headers=key)).json()

        app = _app(live_server, "sessions", tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await _open_rollout(pilot, info["id"])
            view = app.screen.query_one(TokenView)
            assert view.turn.token_texts and len(view.turn.logprobs) == len(view.turn.token_texts)
            await click_until(
                pilot, TokenView, (0, 0), lambda: view.selected == 0, "the clicked token selected"
            )
            assert "logprob" in str(app.screen.query_one("#token-detail").render())

            # The agent continues while the screen is open: the tree grows from the event stream.
            messages += [first["choices"][0]["message"], {"role": "user", "content": "Again."}]
            await http.post("/v1/chat/completions", json={**body, "messages": messages}, headers=key)
            tree = app.screen.query_one(RolloutTree)
            await until(pilot, lambda: 1 in tree._seq_nodes, "turn 1 in the tree", 60)
            await http.delete(f"/admin/sessions/{info['id']}", headers=admin)


@pytest.mark.medium
async def test_rollout_findings_tab_shows_whole_rollout_checks_as_turns_arrive(live_server, tmp_path):
    """One call: the rollout check says `single_call`. A second call repeating the prompt makes every
    call a root: the Findings tab, open all along, says so without reopening the rollout."""
    admin = {"Authorization": f"Bearer {live_server.admin_key}"}
    async with httpx.AsyncClient(base_url=live_server.url, timeout=120) as http:
        info = (
            await http.post("/admin/sessions", json={"metadata": {"task": "findings"}}, headers=admin)
        ).json()
        key = {"Authorization": f"Bearer {info['api_key']}"}
        body = {"model": "any", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
        await http.post("/v1/chat/completions", json=body, headers=key)

        app = _app(live_server, "sessions", tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await _open_rollout(pilot, info["id"])
            await pilot.press("f")
            findings = app.screen.query_one("#findings-text")
            await until(pilot, lambda: "single_call" in str(findings.render()), "the one-call check", 30)

            await http.post("/v1/chat/completions", json=body, headers=key)
            await until(
                pilot, lambda: "every_call_a_root" in str(findings.render()), "the rollout's new check", 60
            )
            assert "single_call" not in str(findings.render())
            await http.delete(f"/admin/sessions/{info['id']}", headers=admin)


@pytest.mark.slow
async def test_terminus2_rollout_finishes_with_captured_turns(live_server, tmp_path):
    """Over 120 s when other engine tests share the 2 cores (147 s on 3 workers, 2026-12-07): a
    whole terminus-2 rollout started from Setup, on the embedded engine, is what it checks the
    TUI follows to its end; a shorter one would not be the rollout an operator starts."""
    app = _app(live_server, "setup", tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.screen.catalog is not None, "the catalog", 60)
        before = set(app.board.entries)
        await _start_batch(pilot, "terminus-2", "hello-file")

        def ended() -> list[str]:
            return [
                sid
                for sid in set(app.board.entries) - before
                if session_state(app.board.get(sid)) in ("finished", "failed")
            ]

        await until(pilot, lambda: bool(ended()), "the terminus-2 rollout to end", 400)
        session_id = ended()[0]
        assert app.board.get(session_id).turns > 0
        app.open_rollout(session_id)
        # query, not query_one: the mode switches before the Rollout screen has composed.
        await until(
            pilot,
            lambda: (
                app.current_mode == "rollout" and any(v.turn is not None for v in app.screen.query(TokenView))
            ),
            "a captured turn",
            60,
        )
        assert app.screen.query_one(RolloutTree)._seq_nodes
