"""The attached TUI as one of several clients of a real server (LocalServer, real SQLite, the real
client over HTTP/SSE): runs other clients start and stop, and the server restarting under it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from textual.widgets import DataTable

from tapdeck.app.client import TapdeckClient
from tapdeck.app.host import LocalServer
from tapdeck.app.tui import TapdeckApp
from tapdeck.app.widgets.session_table import SessionTable
from tapdeck.proxy.config import ServerConfig
from tests.support.pilot_wait import until
from tests.support.ports import free_port

WAIT_S = 120.0  # a generous bound on 2 shared cores, not a speed check


def _app(url: str, key: str, tmp_path: Path) -> TapdeckApp:
    return TapdeckApp(TapdeckClient(url, key), settings_path=tmp_path / "tui.json", initial_mode="sessions")


def _rows(app: TapdeckApp) -> dict[str, str]:
    table = app.screen.query_one(SessionTable)
    return {str(row.value): str(table.get_cell(row.value, "state")) for row in table.rows}


@pytest.mark.medium
async def test_an_attached_tui_reconnects_to_a_server_restarted_on_its_data_dir(upstream, tmp_path):
    cfg = ServerConfig(port=free_port(), data_dir=tmp_path / "data", engine_url=upstream.base_url)
    first = await asyncio.to_thread(LocalServer(cfg).start)
    admin = {"Authorization": f"Bearer {first.admin_key}"}
    async with httpx.AsyncClient(base_url=first.url, headers=admin, timeout=60) as http:
        before = (await http.post("/admin/sessions", json={"metadata": {"task": "before"}})).json()["id"]
    app = _app(first.url, first.admin_key, tmp_path)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.connected and before in _rows(app), "the first server's session")
            await asyncio.to_thread(first.stop)
            await until(pilot, lambda: not app.connected, "the lost connection", WAIT_S)
            await until(
                pilot,
                lambda: "the tapdeck server is not reachable; is it running?" in app.status,
                "the status line saying the server is gone",
                WAIT_S,
            )

            second = await asyncio.to_thread(LocalServer(cfg).start)
            try:
                await until(pilot, lambda: app.connected, "the reconnection", WAIT_S)
                async with httpx.AsyncClient(base_url=second.url, headers=admin, timeout=60) as http:
                    after = (await http.post("/admin/sessions", json={"metadata": {"task": "after"}})).json()[
                        "id"
                    ]
                await until(pilot, lambda: after in _rows(app), "a session opened after the restart", WAIT_S)
                rows = _rows(app)
                assert set(rows) == {before, after}  # nothing lost, nothing twice
                assert rows[before] == "interrupted"
            finally:
                await asyncio.to_thread(second.stop)
    finally:
        await asyncio.to_thread(first.stop)


@pytest.mark.medium
async def test_a_run_another_client_cancels_leaves_no_queued_row_on_sessions(upstream, tmp_path):
    cfg = ServerConfig(port=0, data_dir=tmp_path / "data", engine_url=upstream.base_url)
    server = await asyncio.to_thread(LocalServer(cfg).start)
    try:
        admin = {"Authorization": f"Bearer {server.admin_key}"}
        async with httpx.AsyncClient(base_url=server.url, headers=admin, timeout=60) as http:
            run = (
                await http.post(
                    "/admin/runs",
                    json={"harness": "oracle", "tasks": ["hello-file"], "k": 20, "concurrency": 1},
                )
            ).json()
            app = _app(server.url, server.admin_key, tmp_path)
            async with app.run_test(size=(80, 24)) as pilot:
                # Attached mid-run: the rollouts still to run are rows, `queued`.
                await until(pilot, lambda: "queued" in _rows(app).values(), "the queued rollouts", WAIT_S)
                (await http.post(f"/admin/runs/{run['id']}/cancel")).raise_for_status()
                await until(
                    pilot,
                    lambda: all(
                        state in ("finished", "failed", "cancelled") for state in _rows(app).values()
                    ),
                    "every row of the cancelled run ended or gone",
                    WAIT_S,
                )
                assert (await http.get(f"/admin/runs/{run['id']}")).json()["state"] == "cancelled"
    finally:
        await asyncio.to_thread(server.stop)


async def test_a_server_restarted_with_another_key_is_toasted_whole_and_the_tui_stops_following(
    upstream, tmp_path
):
    cfg = ServerConfig(
        port=free_port(),
        data_dir=tmp_path / "data",
        engine_url=upstream.base_url,
        admin_key="first-key-first-key-first-key",
    )
    first = await asyncio.to_thread(LocalServer(cfg).start)
    app = _app(first.url, first.admin_key, tmp_path)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.connected, "the connection")
            await asyncio.to_thread(first.stop)
            other = cfg.model_copy(update={"admin_key": "other-key-other-key-other-key"})
            second = await asyncio.to_thread(LocalServer(other).start)
            try:
                # The status line shows one line at 80 columns: the whole sentence is a toast.
                await until(
                    pilot,
                    lambda: any("stopped following" in n.message for n in app._notifications),
                    "the toast saying the key was refused",
                    WAIT_S,
                )
                toast = next(n.message for n in app._notifications if "stopped following" in n.message)
                assert toast.startswith("the server rejected the admin key")
                assert "--admin-key" in toast and not app.connected
            finally:
                await asyncio.to_thread(second.stop)
    finally:
        await asyncio.to_thread(first.stop)


@pytest.mark.medium
async def test_runs_after_a_reconnect_shows_the_run_as_the_restarted_server_has_it_and_unrun_rollouts_as_not_run(  # noqa: E501 - the name the claims list pins
    upstream, tmp_path
):
    cfg = ServerConfig(port=free_port(), data_dir=tmp_path / "data", engine_url=upstream.base_url)
    first = await asyncio.to_thread(LocalServer(cfg).start)
    admin = {"Authorization": f"Bearer {first.admin_key}"}
    async with httpx.AsyncClient(base_url=first.url, headers=admin, timeout=60) as http:
        run_id = (
            await http.post(
                "/admin/runs", json={"harness": "oracle", "tasks": ["hello-file"], "k": 20, "concurrency": 1}
            )
        ).json()["id"]
    app = TapdeckApp(
        TapdeckClient(first.url, first.admin_key), settings_path=tmp_path / "tui.json", initial_mode="runs"
    )
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            runs = app.screen.query_one("#runs-table", DataTable)
            rollouts = app.screen.query_one("#rollouts-table", DataTable)

            def state() -> str:
                return str(runs.get_cell(run_id, "state")) if run_id in runs.rows else ""

            await until(pilot, lambda: app.connected and state() == "running", "the running run")
            await asyncio.to_thread(first.stop)  # stopping the server stops its run
            await until(pilot, lambda: not app.connected, "the lost connection", WAIT_S)
            second = await asyncio.to_thread(LocalServer(cfg).start)
            try:
                async with httpx.AsyncClient(base_url=second.url, headers=admin, timeout=60) as http:
                    now = (await http.get(f"/admin/runs/{run_id}")).json()["state"]
                assert now != "running"
                await until(
                    pilot,
                    lambda: app.connected and state() == now,
                    "the run's state after the restart",
                    WAIT_S,
                )

                def phases() -> list[str]:
                    return [str(rollouts.get_cell(key, "phase")) for key in rollouts.rows]

                await until(
                    pilot,
                    lambda: "queued" not in phases() and "not run" in phases(),
                    "the rollouts it never ran shown as not run",
                    WAIT_S,
                )
                assert "agent" not in phases()
            finally:
                await asyncio.to_thread(second.stop)
    finally:
        await asyncio.to_thread(first.stop)
