"""The TUI's status line while its server waits for its default engine (issue 39): "waiting for the
engine at URL (N s)" from `/health`, then that the engine answered. Over the recorded API with its
`/health` saying what a waiting server says; a snapshot at 80×24. An attached TUI whose server
restarts awaiting its engine says so once it reconnects. And an embedded TUI whose wait runs out:
it quits, and `tapdeck tui` exits 1 with the refusal in one line."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time

import pytest

from tapdeck.app import tui
from tapdeck.app.client import TapdeckClient
from tapdeck.app.tui import TapdeckApp
from tapdeck.app.widgets.session_table import SessionTable
from tapdeck.app.widgets.status_line import StatusLine
from tests.support.pilot_wait import until
from tests.support.recorded_api import API_FIXTURE, recorded_app

ENGINE = "http://gpu-box:8000/v1"
WAITING = {"url": ENGINE, "waited_s": 42.4, "limit_s": 1200.0}


def _waiting_data() -> dict:
    data = json.loads(API_FIXTURE.read_text())
    data["health"] = {**data["health"], "engine_wait": WAITING}
    return data


def _status(app: TapdeckApp) -> str:
    return str(app.screen.query_one(StatusLine).render())


async def test_the_status_line_says_the_engine_is_awaited_then_that_it_answered(monkeypatch) -> None:
    monkeypatch.setattr(tui, "ENGINE_POLL_S", 0.05)
    data = _waiting_data()
    app = recorded_app("sessions", data)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.screen.query_one(SessionTable).row_count > 0, "the sessions")
        await until(pilot, lambda: "waiting for the engine" in _status(app), "the wait said")
        assert _status(app) == f"waiting for the engine at {ENGINE} (42 s)"
        assert app.status_level == "warning"
        data["health"] = {**data["health"], "engine_wait": None}  # the engine answered
        await until(pilot, lambda: "answered" in _status(app), "the engine said answered")
        assert _status(app) == "the engine answered · connected to http://tapdeck.test"
        assert app.status_level == "info" and app.engine_wait is None


async def test_a_server_with_its_engine_up_says_nothing_of_it() -> None:
    app = recorded_app("sessions", json.loads(API_FIXTURE.read_text()))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.screen.query_one(SessionTable).row_count > 0, "the sessions")
        await until(pilot, lambda: _status(app) == "http://tapdeck.test", "the server's line")
        await until(
            pilot, lambda: not [w for w in app.workers if w.group == "engine"], "the one /health read"
        )
        assert _status(app) == "http://tapdeck.test" and app.engine_wait is None


@pytest.mark.medium
def test_snapshot_of_the_sessions_screen_while_the_engine_is_awaited(snap_compare) -> None:
    async def waited(pilot) -> None:
        app = pilot.app
        await until(pilot, lambda: app.screen.query_one(SessionTable).row_count > 0, "the sessions")
        await until(pilot, lambda: "waiting for the engine" in _status(app), "the wait said")
        await pilot.pause(0.3)  # a refresh tick after the data
        await pilot.wait_for_scheduled_animations()

    assert snap_compare(recorded_app("sessions", _waiting_data()), terminal_size=(80, 24), run_before=waited)


@pytest.mark.medium
async def test_an_embedded_tui_whose_engine_wait_runs_out_quits_keeping_the_refusal(tmp_path) -> None:
    from tapdeck.app.commands.tui import EngineWatch
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.config import ServerConfig
    from tests.support.ports import free_port

    address = f"127.0.0.1:{free_port()}"
    server = LocalServer(
        ServerConfig(port=0, data_dir=tmp_path, engine_url=address, engine_wait_s=0.5)
    ).start()
    watch = EngineWatch(server)
    app = TapdeckApp(
        TapdeckClient(server.url, server.admin_key),
        settings_path=tmp_path / "tui.json",
        initial_mode="sessions",
    )
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            watch.start(app)
            await until(pilot, lambda: watch.failure is not None and not app.is_running, "the TUI quit")
    finally:
        watch.done.set()
        server.stop()
    assert watch.failure is not None and watch.failure.status == 502
    assert str(watch.failure).startswith(f"no engine answered at '{address}'")
    assert str(watch.failure).endswith(" s; --engine-wait)")


class _AppStandIn:
    """What `EngineWatch` needs of the TUI: `call_from_thread` refuses (as Textual does) until it
    runs, and `exit` ends it."""

    def __init__(self) -> None:
        self.running = False
        self.exited = threading.Event()

    def call_from_thread(self, callback) -> None:
        if not self.running:
            raise RuntimeError("App is not running")
        callback()

    def exit(self) -> None:
        self.exited.set()


@pytest.mark.medium
def test_tapdeck_tui_whose_engine_wait_runs_out_exits_1_in_one_line(tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from tapdeck.app.cli import app as cli
    from tapdeck.app.commands import tui as tui_command
    from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN
    from tests.support.ports import free_port

    ran: list[_AppStandIn] = []

    def run_app(base_url: str, admin_key: str, *, before, **_) -> None:
        stand_in = _AppStandIn()
        ran.append(stand_in)
        before(stand_in)
        # Up only once the wait has run out: the watch holds the refusal until it can end the TUI.
        time.sleep(1.5)
        stand_in.running = True
        assert stand_in.exited.wait(30), "the TUI was not ended"

    monkeypatch.setattr(tui_command, "run_app", run_app)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level  # the TUI sends logging to its tui.log
    address = f"127.0.0.1:{free_port()}"
    try:
        result = CliRunner().invoke(
            cli, ["tui", "--engine", address, "--engine-wait", "0.5", "--data-dir", str(tmp_path)]
        )
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    assert ran and ran[0].exited.is_set()
    assert result.exit_code == EXIT_COULD_NOT_RUN, result.output
    assert f"tapdeck: waiting for the engine at {address}…" in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(
        f"tapdeck: no engine answered at '{address}': tried GET http://{address}/v1/models"
    )
    assert re.search(r" \(waited \d+ s; --engine-wait\)$", last), last


@pytest.mark.medium
async def test_an_attached_tui_says_so_when_its_server_restarts_awaiting_its_engine(
    upstream, tmp_path
) -> None:
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.config import ServerConfig
    from tests.support.ports import free_port

    port, data = free_port(), tmp_path / "data"
    first = await asyncio.to_thread(
        LocalServer(ServerConfig(port=port, data_dir=data, engine_url=upstream.base_url)).start
    )
    app = TapdeckApp(
        TapdeckClient(first.url, first.admin_key),
        settings_path=tmp_path / "tui.json",
        initial_mode="sessions",
    )
    address = f"127.0.0.1:{free_port()}"  # nothing listens: the engine is still loading
    second = LocalServer(ServerConfig(port=port, data_dir=data, engine_url=address))
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.connected and _status(app) == f"connected to {first.url}", "up")
            await asyncio.to_thread(first.stop)
            await until(pilot, lambda: not app.connected, "the lost connection", 120)
            await asyncio.to_thread(second.start)
            await until(
                pilot, lambda: f"waiting for the engine at {address} (" in _status(app), "the wait", 120
            )
            assert app.status_level == "warning"
    finally:
        await asyncio.to_thread(second.stop)
        await asyncio.to_thread(first.stop)
