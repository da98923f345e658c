"""The TUI attached to several tapdeck servers at once (`tapdeck attach URL URL…`): every server's
rows in one table with a server column, each action sent to its row's server, and a server that
stops answering greyed, not removed, until it answers again.

Two real `tapdeck serve` processes (their own data dirs, ports and admin keys, so a request sent to
the wrong one is refused), and SVG snapshots over the recorded API served twice under two names
(the same ids on both servers: they must stay two rows each)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from rich.text import Text
from textual.widgets import DataTable

from tapdeck.app.client import TapdeckClient
from tapdeck.app.server_links import ServerLink
from tapdeck.app.tui import TapdeckApp
from tapdeck.app.widgets.filter_bar import FilterBar
from tapdeck.app.widgets.nav_bar import NavBar
from tapdeck.app.widgets.session_table import SessionTable
from tests.support.fake_vllm import not_a_probe
from tests.support.pilot_wait import until
from tests.support.ports import free_port
from tests.support.recorded_api import FROZEN_NOW, recorded_transport
from tests.support.tapdeck_process import TAPDECK, stop, tapdeck_serve

ALPHA_KEY = "alpha-admin-key-alpha-admin-key"
BETA_KEY = "beta-admin-key-beta-admin-key-b"
WAIT_S = 120.0  # a generous bound on 2 shared cores, not a speed check
RECORDED_SESSIONS = 8
BETA_URL = "http://beta.test"


class Unplugged(httpx.AsyncBaseTransport):
    """The recorded API, or, once `down`, a server that refuses connections; `posts` lists the
    paths of the POSTs it was sent."""

    def __init__(self) -> None:
        self.inner = recorded_transport()
        self.down = False
        self.posts: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.method == "POST":
            self.posts.append(request.url.path)
        return await self.inner.handle_async_request(request)


def _recorded_pair(beta: Unplugged, alpha_transport: Unplugged | None = None) -> TapdeckApp:
    alpha = TapdeckClient("http://alpha.test", "test-key", transport=alpha_transport or Unplugged())
    return TapdeckApp(
        alpha,
        server_name="alpha",
        others=[
            ServerLink(
                "beta", "http://beta.test", TapdeckClient("http://beta.test", "test-key", transport=beta)
            )
        ],
        follow_events=False,
        clock=lambda: FROZEN_NOW,
        initial_mode="sessions",
    )


def _cells(app: TapdeckApp, column: str) -> dict[str, str | Text]:
    table = app.screen.query_one(SessionTable)
    return {str(row.value): table.get_cell(row.value, column) for row in table.rows}


def _greyed(cell: str | Text) -> bool:
    return isinstance(cell, Text) and str(cell.style) == "dim"


async def test_the_same_ids_on_two_servers_are_two_rows_each_with_its_server():
    app = _recorded_pair(Unplugged())
    async with app.run_test(size=(80, 24)) as pilot:
        await until(
            pilot, lambda: len(_cells(app, "server")) == 2 * RECORDED_SESSIONS, "both servers' sessions"
        )
        servers = _cells(app, "server")
        assert sorted(set(map(str, servers.values()))) == ["alpha", "beta"]
        for key, server in servers.items():
            assert key.startswith(f"{server}/")
        assert app.status == "connected to alpha, beta"
        summary = str(app.screen.query_one("#sessions-summary").render())
        assert summary.startswith(f"{2 * RECORDED_SESSIONS} sessions on 2 servers")
        assert "root/fork hidden (under 120 columns)" in summary

        await pilot.press("slash", *"server:beta", "enter")
        await until(
            pilot,
            lambda: set(map(str, _cells(app, "server").values())) == {"beta"},
            "only beta's rows once filtered",
        )
        assert len(_cells(app, "server")) == RECORDED_SESSIONS
        assert str(app.screen.query_one(FilterBar).query_one("Static").render()) == (
            f"/ server:beta ({RECORDED_SESSIONS} of {2 * RECORDED_SESSIONS})"
        )


async def test_a_recorded_server_that_stops_answering_keeps_its_rows_greyed():
    beta = Unplugged()
    app = _recorded_pair(beta)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: len(_cells(app, "state")) == 2 * RECORDED_SESSIONS, "both servers' rows")
        await pilot.press("4")
        runs = app.screen.query_one("#runs-table", DataTable)
        await until(pilot, lambda: runs.row_count > 0 and runs.row_count == len(app.screen.runs), "the runs")
        listed = runs.row_count
        await pilot.press("2")
        beta.down = True
        app.resync()
        await until(pilot, lambda: "beta unreachable" in app.status, "the status line naming beta")
        await until(
            pilot,
            lambda: all(
                _greyed(cell) == key.startswith("beta/") for key, cell in _cells(app, "state").items()
            ),
            "beta's rows greyed, alpha's not",
        )
        assert len(_cells(app, "state")) == 2 * RECORDED_SESSIONS  # nothing removed
        assert app.status_level == "error" and app.status.endswith("connected to alpha")

        # Runs: beta's runs as it last listed them, greyed; no failure said for the server that is gone.
        await pilot.press("4")
        await until(
            pilot,
            lambda: all(
                _greyed(runs.get_cell(row.value, "state")) == str(row.value).startswith("beta/")
                for row in runs.rows
            ),
            "beta's runs greyed, alpha's not",
        )
        assert runs.row_count == listed
        assert not any(n.severity == "error" and "failed" in (n.title or "") for n in app._notifications)
        await pilot.press("2")

        beta.down = False
        app.resync()
        await until(
            pilot,
            lambda: not any(map(_greyed, _cells(app, "state").values())),
            "beta's rows no longer greyed",
        )
        assert app.status == "connected to alpha, beta"


async def test_an_export_on_runs_goes_to_the_server_of_the_run_shown():
    alpha, beta = Unplugged(), Unplugged()
    app = _recorded_pair(beta, alpha)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("4")
        runs = app.screen.query_one("#runs-table", DataTable)
        await until(pilot, lambda: runs.row_count > 0 and runs.row_count == len(app.screen.runs), "the runs")
        recorded = runs.row_count // 2
        keys = [str(row.value) for row in runs.rows]
        # The same recorded runs on each server: every run id twice, once per server.
        assert sorted(k.split("/", 1)[0] for k in keys) == ["alpha"] * recorded + ["beta"] * recorded
        beta_run = next(k for k in keys if k.startswith("beta/"))
        runs.move_cursor(row=runs.get_row_index(beta_run))
        await until(
            pilot, lambda: app.screen.run_key == beta_run and app.screen.link.name == "beta", "beta's run"
        )
        await pilot.press("e")
        await until(pilot, lambda: beta.posts, "the export request")
        assert beta.posts == [f"/admin/runs/{beta_run.split('/', 1)[1]}/export"] and alpha.posts == []


async def test_setup_info_and_train_work_on_the_server_picked_in_the_palette():
    app = _recorded_pair(Unplugged())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("5")
        info = app.screen.query_one("#server-info")
        await until(pilot, lambda: "server http://alpha.test" in str(info.render()), "Info on alpha")
        assert "5 Info on alpha" in str(app.screen.query_one(NavBar).render())
        app.use_server("beta")
        await until(pilot, lambda: "server http://beta.test" in str(info.render()), "Info on beta")
        assert "5 Info on beta" in str(app.screen.query_one(NavBar).render())
        assert app.client.base_url == "http://beta.test"


def test_snapshot_of_sessions_on_two_servers(snap_compare):
    async def ready(pilot):
        app = pilot.app
        await until(pilot, lambda: len(_cells(app, "server")) == 2 * RECORDED_SESSIONS, "both servers' rows")
        await pilot.pause(0.3)

    assert snap_compare(_recorded_pair(Unplugged()), terminal_size=(80, 24), run_before=ready)


def test_snapshot_of_sessions_with_one_of_two_servers_unreachable(snap_compare):
    beta = Unplugged()

    async def ready(pilot):
        app = pilot.app
        await until(pilot, lambda: len(_cells(app, "server")) == 2 * RECORDED_SESSIONS, "both servers' rows")
        beta.down = True
        app.resync()
        await until(pilot, lambda: "beta unreachable" in app.status, "beta shown unreachable")
        await until(
            pilot,
            lambda: all(
                _greyed(cell) for key, cell in _cells(app, "task").items() if key.startswith("beta/")
            ),
            "beta's rows greyed",
        )
        await pilot.pause(0.3)

    assert snap_compare(_recorded_pair(beta), terminal_size=(80, 24), run_before=ready)


# -- two real `tapdeck serve` processes ---------------------------------------------------------------


async def _call(method: str, url: str, key: str, path: str, body: dict | None = None) -> dict:
    admin = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=admin, timeout=60) as http:
        reply = await http.request(method, path, json=body)
        reply.raise_for_status()
        return reply.json()


@pytest.mark.medium
@pytest.mark.skipif(not TAPDECK.exists(), reason="needs the installed tapdeck console script")
async def test_two_served_servers_in_one_tui_rows_actions_and_a_server_that_drops(upstream, tmp_path: Path):
    beta_port = free_port()

    def serve(name: str, key: str, port: int | None = None):
        return tapdeck_serve(
            TAPDECK,
            tmp_path / name,
            tmp_path / f"{name}.log",
            admin_key=key,
            engine_url=upstream.base_url,
            env={"XDG_CONFIG_HOME": str(tmp_path / "config")},
            port=port,
        )

    # Each run's first rollout waits on a model call the engine holds: neither run ends by itself
    # (oracle rollouts did, before the cancel on a loaded machine).
    upstream.hold = not_a_probe
    run_plan = {"harness": "terminus-2", "tasks": ["hello-file"], "k": 2, "concurrency": 1}
    with serve("alpha", ALPHA_KEY) as alpha, serve("beta", BETA_KEY, beta_port) as beta:
        opened = {"metadata": {"task": "on-alpha"}}
        on_alpha = (await _call("POST", alpha.url, ALPHA_KEY, "/admin/sessions", opened))["id"]
        opened = {"metadata": {"task": "on-beta"}}
        on_beta = (await _call("POST", beta.url, BETA_KEY, "/admin/sessions", opened))["id"]
        alpha_run = (await _call("POST", alpha.url, ALPHA_KEY, "/admin/runs", run_plan))["id"]
        beta_run = (await _call("POST", beta.url, BETA_KEY, "/admin/runs", run_plan))["id"]
        app = TapdeckApp(
            TapdeckClient(alpha.url, ALPHA_KEY),
            server_name="alpha",
            others=[ServerLink("beta", beta.url, TapdeckClient(beta.url, BETA_KEY))],
            settings_path=tmp_path / "tui.json",
            initial_mode="sessions",
        )
        async with app.run_test(size=(80, 24)) as pilot:
            keys = {f"alpha/{on_alpha}", f"beta/{on_beta}"}
            await until(pilot, lambda: keys <= set(_cells(app, "server")), "a session of each server", WAIT_S)
            servers = _cells(app, "server")
            assert (str(servers[f"alpha/{on_alpha}"]), str(servers[f"beta/{on_beta}"])) == ("alpha", "beta")
            assert str(_cells(app, "task")[f"beta/{on_beta}"]) == "on-beta"

            # Cancel beta's run from Runs: it goes to beta, and alpha's run goes on.
            await pilot.press("4")
            runs = app.screen.query_one("#runs-table", DataTable)
            await until(
                pilot,
                lambda: {f"alpha/{alpha_run}", f"beta/{beta_run}"} <= {str(r.value) for r in runs.rows},
                "both servers' runs",
                WAIT_S,
            )
            assert str(runs.get_cell(f"beta/{beta_run}", "server")) == "beta"
            runs.move_cursor(row=runs.get_row_index(f"beta/{beta_run}"))
            await until(pilot, lambda: app.screen.run_key == f"beta/{beta_run}", "beta's run shown")
            await pilot.press("x", "x")
            await until(
                pilot,
                lambda: any(n.message == f"run {beta_run} on beta cancelled" for n in app._notifications),
                "the cancel done",
                WAIT_S,
            )
            assert (await _call("GET", beta.url, BETA_KEY, f"/admin/runs/{beta_run}"))["state"] == "cancelled"
            assert (await _call("GET", alpha.url, ALPHA_KEY, f"/admin/runs/{alpha_run}"))[
                "state"
            ] == "running"

            # beta stops: its rows stay, greyed, and the status line names it.
            await pilot.press("2")
            await asyncio.to_thread(stop, beta)
            await until(pilot, lambda: "beta unreachable" in app.status, "beta shown unreachable", WAIT_S)
            await until(
                pilot, lambda: _greyed(_cells(app, "state")[f"beta/{on_beta}"]), "beta's rows greyed", WAIT_S
            )
            states = _cells(app, "state")
            assert f"beta/{on_beta}" in states and not _greyed(states[f"alpha/{on_alpha}"])

            # beta again, on its data dir and port: its rows answer again (as that server has them).
            with serve("beta", BETA_KEY, beta_port):
                await until(
                    pilot,
                    lambda: (
                        app.status == "connected to alpha, beta"
                        and not _greyed(_cells(app, "state")[f"beta/{on_beta}"])
                    ),
                    "beta back",
                    WAIT_S,
                )
                assert str(_cells(app, "state")[f"beta/{on_beta}"]) == "interrupted"
            await _call("POST", alpha.url, ALPHA_KEY, f"/admin/runs/{alpha_run}/cancel")
