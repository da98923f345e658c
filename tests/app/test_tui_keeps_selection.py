"""Pilot tests over the recorded API: what a person highlighted stays highlighted as the server's
state moves on (run events, a new run, coming back to a screen), and each rollout is listed once."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Static

from tapdeck.app.client import TapdeckClient
from tapdeck.app.messages import RunsChanged
from tapdeck.app.tui import TapdeckApp
from tapdeck.app.widgets.session_table import SessionTable
from tests.support.pilot_wait import until
from tests.support.recorded_api import FROZEN_NOW, recorded_transport


def _app(api_data: dict, mode: str) -> TapdeckApp:
    """The App over `api_data`, which a test changes to play the server's next answers."""
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    return TapdeckApp(client, follow_events=False, clock=lambda: FROZEN_NOW, initial_mode=mode)


def _cursor_key(table: DataTable) -> str:
    return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value


async def _third_rollout_highlighted(pilot) -> tuple[DataTable, str]:
    """On Runs, the newest run's rollouts table focused and its third row highlighted, as a
    person gets there with the keys: (the table, that rollout's id)."""
    table = pilot.app.screen.query_one("#rollouts-table", DataTable)
    await until(pilot, lambda: table.row_count == 4, "the run's rollouts")
    for _ in range(3):  # bounded: a changed focus order fails below instead of looping
        if pilot.app.focused is table:
            break
        await pilot.press("tab")
    assert pilot.app.focused is table
    await pilot.press("down", "down")
    key = table.coordinate_to_cell_key((2, 0)).row_key.value
    assert _cursor_key(table) == key
    return table, key


def _rollout(api_data: dict, rollout_id: str) -> dict:
    return next(r for r in api_data["run_details"]["run-0001"]["rollouts"] if r["rollout_id"] == rollout_id)


@pytest.mark.medium
async def test_runs_keeps_the_selected_rollout_when_the_run_updates(api_data):
    app = _app(api_data, "runs")
    async with app.run_test(size=(80, 24)) as pilot:
        table, key = await _third_rollout_highlighted(pilot)
        other = table.coordinate_to_cell_key((0, 0)).row_key.value
        _rollout(api_data, other)["reward"] = 1.0  # another rollout finished
        app.post_message(RunsChanged())
        await until(pilot, lambda: str(table.get_cell(other, "reward")) == "1.00", "the run's update")
        assert _cursor_key(table) == key
        assert str(app.screen.query_one("#run-settings", Static).render()).startswith(
            "{task} #{index}".format(**_rollout(api_data, key))
        )


@pytest.mark.medium
async def test_runs_keeps_the_selected_rollout_when_coming_back_to_the_screen(api_data):
    app = _app(api_data, "runs")
    async with app.run_test(size=(80, 24)) as pilot:
        table, key = await _third_rollout_highlighted(pilot)
        await pilot.press("2")
        await until(pilot, lambda: app.current_mode == "sessions", "the Sessions screen")
        _rollout(api_data, key)["reward"] = 1.0
        await pilot.press("4")
        await until(
            pilot, lambda: str(table.get_cell(key, "reward")) == "1.00", "the run reloaded on coming back"
        )
        assert _cursor_key(table) == key


@pytest.mark.medium
async def test_runs_moves_to_the_nearest_rollout_when_the_selected_one_is_gone(api_data):
    app = _app(api_data, "runs")
    async with app.run_test(size=(80, 24)) as pilot:
        table, key = await _third_rollout_highlighted(pilot)
        after = table.coordinate_to_cell_key((3, 0)).row_key.value
        rollouts = api_data["run_details"]["run-0001"]["rollouts"]
        rollouts.remove(_rollout(api_data, key))
        app.post_message(RunsChanged())
        await until(pilot, lambda: table.row_count == 3, "the run without that rollout")
        assert _cursor_key(table) == after  # the row that took its place


@pytest.mark.medium
async def test_runs_keeps_the_selected_run_when_a_new_run_appears(api_data):
    app = _app(api_data, "runs")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        runs = screen.query_one("#runs-table", DataTable)
        await until(pilot, lambda: runs.row_count == 2 and screen.detail is not None, "the runs")
        assert app.focused is runs and _cursor_key(runs) == "run-0001"  # the newest first
        await pilot.press("down")
        await until(pilot, lambda: screen.detail.id == "run-0000", "the older run's detail")
        api_data["runs"].insert(0, dict(api_data["runs"][0], id="run-0002", created_at=9e9))
        api_data["run_details"]["run-0002"] = dict(api_data["run_details"]["run-0001"], id="run-0002")
        app.post_message(RunsChanged())  # what a run_started event becomes
        await until(
            pilot,
            lambda: runs.row_count == 3 and screen.detail.id == _cursor_key(runs),
            "the new run listed and the shown run's detail",
        )
        assert _cursor_key(runs) == screen.run_id == screen.detail.id == "run-0000"


async def test_sessions_lists_a_starting_rollout_once_when_its_session_is_listed(api_data):
    # Just after a batch starts: the rollout's session is listed (its metadata names the rollout)
    # while the run's detail does not name that session yet.
    run = api_data["run_details"]["run-0001"]
    for body in (run, next(r for r in api_data["runs"] if r["id"] == "run-0001")):
        body["state"] = "running"
    starting = next(r for r in run["rollouts"] if r["session_id"] == "sess0005recorded")
    starting["session_id"] = None
    app = _app(api_data, "sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: starting["rollout_id"] in app.board.rollouts, "the run's rollouts")
        app.screen.refresh_table(force=True)
        table = app.screen.query_one(SessionTable)
        assert starting["rollout_id"] not in table.rows and "sess0005recorded" in table.rows
        assert table.row_count == len(api_data["sessions"]) == 8
        summary = str(app.screen.query_one("#sessions-summary", Static).render())
        assert summary.startswith("8 sessions · ")
        # Its row still knows its rollout (the details pane, `x` to cancel it).
        assert app.board.rollout_of("sess0005recorded").rollout_id == starting["rollout_id"]
