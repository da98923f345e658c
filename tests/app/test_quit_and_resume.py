"""Quitting a TUI whose own server is running a batch asks once more; `u` on Runs resumes a stopped
run. The quit guard is driven over the recorded API; resume against a real server whose engine
hangs, so the rollout is still in its first model call when it is cancelled and again when resumed."""

from __future__ import annotations

import copy

import pytest

from tapdeck.app.tui import TapdeckApp
from tests.support.hung_server import HungServer
from tests.support.pilot_wait import until
from tests.support.recorded_api import recorded_app


def _recorded(api_data: dict, run_state: str, *, owns_server: bool) -> TapdeckApp:
    data = copy.deepcopy(api_data)
    data["runs"][0]["state"] = run_state
    return recorded_app("sessions", data, owns_server=owns_server)


def _notes(app: TapdeckApp) -> list[str]:
    return [n.message for n in app._notifications]


async def test_q_with_a_run_going_on_its_own_server_asks_once_more_then_quits(api_data):
    app = _recorded(api_data, "running", owns_server=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
        await until(pilot, lambda: any("still going" in n for n in _notes(app)), "the warning", 10)
        assert app.is_running
        note = next(n for n in _notes(app) if "still going" in n)
        assert "Runs with u" in note and "Press q again within 5 s to quit" in note
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "the quit", 10)


@pytest.mark.parametrize(
    ("run_state", "owns_server"),
    [("finished", True), ("running", False)],
    ids=["nothing-running", "attached"],
)
async def test_q_quits_at_once_when_nothing_runs_or_the_server_is_elsewhere(api_data, run_state, owns_server):
    app = _recorded(api_data, run_state, owns_server=owns_server)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "the quit", 10)
        assert not any("still going" in n for n in _notes(app))


@pytest.mark.slow
async def test_u_on_runs_resumes_a_cancelled_run_on_a_real_server(hung_server: HungServer) -> None:
    engine = hung_server.engine
    async with hung_server.one_rollout_run("runs") as (app, pilot, run):
        await until(pilot, lambda: engine.held, "the rollout's first model call", 180)
        await app.client.cancel_run(run.id)
        await until(
            pilot,
            lambda: (
                app.screen.detail is not None
                and app.screen.detail.id == run.id
                and app.screen.detail.rollouts[0].error_kind == "cancelled"
            ),
            "the cancelled rollout on Runs",
            120,
        )
        await until(pilot, lambda: not engine.held, "the cancelled call's end", 60)

        await pilot.press("u")
        await until(
            pilot, lambda: any("resumed: 1 rollout(s)" in n for n in _notes(app)), "the resume notice", 30
        )
        await until(pilot, lambda: engine.held, "the resumed rollout's model call", 180)
        assert (await app.client.run(run.id)).state == "running"
        await app.client.cancel_run(run.id)
        await until(pilot, lambda: not engine.held, "the second cancel", 60)
