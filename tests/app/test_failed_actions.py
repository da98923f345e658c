"""Actions that fail say why: the server's own message as a notification, never silence. Driven
against a real LocalServer whose engine probes fine and never answers a model call (so a rollout
stays live until it is cancelled)."""

from __future__ import annotations

import shutil

import httpx
import pytest
from textual.widgets import DataTable, Input, SelectionList

from tapdeck.app.client import ApiError, TapdeckClient
from tapdeck.app.confirm import CONFIRM_S
from tapdeck.app.tui import TapdeckApp
from tapdeck.app.widgets.session_table import SessionTable
from tapdeck.runner.datasets import SAMPLE_DATASET_DIR
from tests.support.hung_server import HungServer
from tests.support.pilot_wait import until
from tests.support.recorded_api import recorded_transport


def _notes(app: TapdeckApp) -> list[str]:
    return [n.message for n in app._notifications]


def _app(hung_server: HungServer, mode: str) -> TapdeckApp:
    server = hung_server.server
    return TapdeckApp(
        TapdeckClient(server.url, server.admin_key),
        settings_path=hung_server.settings_path,
        initial_mode=mode,
    )


@pytest.mark.medium
@pytest.mark.parametrize("path", ["/nonexistent/ds4", "/tmp"])
async def test_setup_start_with_a_bad_dataset_path_shows_the_servers_reason(hung_server, path):
    app = _app(hung_server, "setup")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.catalog is not None, "the catalog", 60)
        screen.query_one("#dataset-path", Input).value = path
        # The picked dataset's hint names its own path, which may be under /tmp too: wait for the
        # hint that starts with the typed path.
        await until(
            pilot,
            lambda: str(screen.query_one("#why-dataset").render()).startswith(f"{path}:"),
            "the typed path's hint",
        )
        hint = str(screen.query_one("#why-dataset").render())
        assert hint.startswith(f"{path}:") and "sample" not in hint
        with pytest.raises(ApiError) as refused:  # what the server says to this very plan
            await app.client.start_run(screen.plan())
        reason = refused.value.detail
        assert reason and "/admin/runs" not in reason
        await pilot.press("ctrl+s")
        await until(pilot, lambda: reason in _notes(app), "the server's reason as a notification", 60)
        assert app.status_level == "error"
        assert app.current_mode == "setup"
        assert await app.client.runs() == []


@pytest.mark.medium
async def test_setup_start_warns_naming_each_task_folder_the_run_leaves_out(hung_server, tmp_path):
    dataset = tmp_path / "dataset"
    for name in ("hello-file", "greet-script"):
        shutil.copytree(SAMPLE_DATASET_DIR / name, dataset / name)
    toml = dataset / "greet-script" / "task.toml"
    toml.write_text('version = "1.0"\n[task]\nname = 5\n')
    why = f"{toml}: not a task config (task.name: Input should be a valid string)"
    app = _app(hung_server, "setup")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.catalog is not None, "the catalog", 60)
        screen.query_one("#dataset-path", Input).value = str(dataset)
        await pilot.press("ctrl+s")
        await until(pilot, lambda: why in _notes(app), "the left-out task as a warning", 60)
        [note] = [n for n in app._notifications if n.message == why]
        assert note.severity == "warning" and note.title.startswith("1 task folder left out")
        [run] = await app.client.runs()
        assert run.left_out == [why] and run.counts.total == 1  # hello-file alone
        await app.run_action("app.switch_mode('runs')")

        def failures_line() -> str:
            shown = next(app.screen.query("#failures").results(), None)
            return str(shown.render()) if shown is not None else ""

        await until(
            pilot,
            lambda: "· 1 task folder left out" in failures_line(),
            "the run's left-out folder on Runs",
            60,
        )


async def test_a_refused_start_toasts_the_servers_message_not_the_request_or_its_status(api_data):
    recorded = recorded_transport(api_data)
    reason = "dataset /data/ds4: no task.toml under it"

    def refusing(request: httpx.Request) -> httpx.Response:
        if (request.method, request.url.path) == ("POST", "/admin/runs"):
            return httpx.Response(400, json={"detail": reason})
        return recorded.handler(request)

    client = TapdeckClient("http://tapdeck.test", "test-key", transport=httpx.MockTransport(refusing))
    app = TapdeckApp(client, follow_events=False, initial_mode="setup")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.screen.catalog is not None, "the catalog", 10)
        await pilot.press("ctrl+s")
        await until(
            pilot,
            lambda: any((n.title or "").endswith("failed") for n in app._notifications),
            "the refusal as a notification",
            10,
        )
        [note] = [n for n in app._notifications if (n.title or "").endswith("failed")]
        assert note.message == reason  # not "POST /admin/runs refused (400): …"
        assert app.status == reason and app.status_level == "error"


def _recorded(api_data: dict, clock: list[float], mode: str) -> TapdeckApp:
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    return TapdeckApp(
        client,
        server_label="http://tapdeck.test",
        follow_events=False,
        clock=lambda: clock[0],
        initial_mode=mode,
    )


@pytest.mark.medium
async def test_runs_x_asks_first_then_cancels_and_a_cancelled_run_says_so(hung_server):
    async with hung_server.one_rollout_run("runs") as (app, pilot, run):
        screen = app.screen
        await until(pilot, lambda: screen.run_id == run.id, "the run on Runs", 60)
        await pilot.press("x")
        await until(
            pilot, lambda: any("Press x again within 5 s" in n for n in _notes(app)), "the confirmation", 10
        )
        assert (await app.client.run(run.id)).state == "running"  # one press only asks
        await pilot.press("x")
        await until(pilot, lambda: any(f"run {run.id} cancelled" in n for n in _notes(app)), "the cancel", 60)
        await until(
            pilot,
            lambda: next(r for r in screen.runs if r.id == run.id).state != "running",
            "the run's end on Runs",
            120,
        )
        state = next(r for r in screen.runs if r.id == run.id).state
        assert (await app.client.run(run.id)).state == state
        await pilot.press("x")
        assert f"run {run.id} already {state}: nothing to cancel." in _notes(app)


async def test_runs_x_confirmation_expires_and_a_finished_run_is_not_cancelled(api_data):
    clock = [1000.0]
    api_data["runs"][0]["state"] = "running"
    app = _recorded(api_data, clock, "runs")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.run_id == api_data["runs"][0]["id"], "the runs", 10)
        await pilot.press("x")
        clock[0] += CONFIRM_S + 1
        await pilot.press("x")  # too late: it asks again instead of cancelling
        await pilot.pause()
        assert sum("Press x again" in n for n in _notes(app)) == 2
        assert not any(
            "cancel" in (n.title or "") and "failed" in (n.title or "") for n in app._notifications
        )

        finished = api_data["runs"][1]
        screen.query_one("#runs-table", DataTable).move_cursor(row=1)
        await until(pilot, lambda: screen.run_id == finished["id"], "the finished run", 10)
        await pilot.press("x")
        assert f"run {finished['id']} already finished: nothing to cancel." in _notes(app)


async def test_runs_x_with_no_runs_says_there_is_none(api_data):
    api_data["runs"] = []
    app = _recorded(api_data, [1000.0], "runs")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("x")
        assert "No run to cancel: start a batch on Setup." in _notes(app)
        await pilot.press("o")
        assert "No rollout to open: start a batch on Setup." in _notes(app)


def _highlight(table: DataTable, key: str) -> None:
    table.move_cursor(row=table.get_row_index(key))


async def test_sessions_x_says_why_a_row_cannot_be_cancelled(api_data):
    app = _recorded(api_data, [1000.0], "sessions")
    async with app.run_test(size=(100, 30)) as pilot:
        table = app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == 8, "the recorded sessions", 10)
        for key, word in (("sess0002recorded", "finished"), ("sess0003recorded", "cancelled")):
            _highlight(table, key)
            await pilot.pause()
            await pilot.press("x")
            rollout_id = next(s for s in api_data["sessions"] if s["id"] == key)["metadata"]["rollout_id"]
            assert f"rollout {rollout_id} already {word}: nothing to cancel." in _notes(app)
        assert not any("Press x again" in n for n in _notes(app))


async def test_sessions_x_on_an_empty_table_says_nothing_is_highlighted(api_data):
    api_data["sessions"] = []
    app = _recorded(api_data, [1000.0], "sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("x")
        assert "No session highlighted: nothing to cancel." in _notes(app)
        await pilot.press("d")
        await pilot.pause()
        pane = str(app.screen.query_one("#activity-text").render())
        assert "none: the table is empty" in pane and "not loaded yet" not in pane


async def test_sessions_x_confirmation_expires_and_a_failed_cancel_says_why(api_data):
    clock = [1000.0]
    live = next(s for s in api_data["sessions"] if s["id"] == "sess0006recorded")
    live["metadata"].update(phase="agent", run_id="run-0001", rollout_id="run-0001.g009r00")
    app = _recorded(api_data, clock, "sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == 8, "the recorded sessions", 10)
        _highlight(table, "sess0006recorded")
        await pilot.pause()
        await pilot.press("x")
        clock[0] += CONFIRM_S + 1
        await pilot.press("x")  # too late: it asks again
        await pilot.pause()
        assert sum("Press x again within 5 s" in n for n in _notes(app)) == 2
        await pilot.press("x")  # in time: the recorded API knows no such rollout, and says so
        await until(
            pilot,
            lambda: any((n.title or "").startswith("cancel-rollout failed") for n in app._notifications),
            "the server's refusal",
            10,
        )


@pytest.mark.medium
async def test_setup_start_twice_with_the_same_plan_asks_before_a_second_run(hung_server):
    app = _app(hung_server, "setup")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.catalog is not None, "the catalog", 60)
        screen.query_one("#tasks", SelectionList).select("hello-file")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: app.current_mode == "sessions", "the first run's start", 60)
        [first] = await app.client.runs()
        await pilot.press("1")
        await until(pilot, lambda: app.screen is screen, "Setup again", 10)
        await pilot.press("ctrl+s")
        await until(
            pilot,
            lambda: any("with this same plan is still running" in n for n in _notes(app)),
            "the warning",
            60,
        )
        assert [r.id for r in await app.client.runs()] == [first.id]
        await pilot.press("ctrl+s")
        await until(pilot, lambda: app.current_mode == "sessions", "the second run's start", 60)
        runs = await app.client.runs()
        assert len(runs) == 2
        for run in runs:
            await app.client.cancel_run(run.id)
