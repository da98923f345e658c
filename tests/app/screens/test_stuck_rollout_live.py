"""The stuck-rollout pane, live: a real server whose vLLM-shaped engine never answers, a real
terminus-2 rollout on the host sandbox hung in its first model call, the TUI at 80×24 driven by
keys: `d` shows the call in flight and the task the agent was given, `x x` cancels that rollout."""

from __future__ import annotations

import pytest

from tapdeck.app.screens.sessions import SessionsScreen
from tapdeck.app.widgets.activity_pane import ActivityPane
from tapdeck.app.widgets.session_table import SessionTable
from tests.support.hung_server import HungServer
from tests.support.pilot_wait import until

pytestmark = pytest.mark.slow
WAIT_S = 180.0  # a bound for a trial to reach its agent on 2 shared cores, not a speed check


def _pane_text(screen: SessionsScreen) -> str:
    return str(screen.query_one("#activity-text").render())


async def test_stuck_rollout_pane_shows_the_hung_call_and_cancels_the_rollout(
    hung_server: HungServer,
) -> None:
    engine = hung_server.engine
    async with hung_server.one_rollout_run("sessions") as (app, pilot, run):
        rid = f"{run.id}.g000r00"
        screen = app.screen
        assert isinstance(screen, SessionsScreen)
        await until(pilot, lambda: screen.query_one(SessionTable).row_count == 1, "the session", WAIT_S)
        await pilot.press("d")
        assert screen.query_one(ActivityPane).has_class("shown")
        await until(
            pilot,
            lambda: engine.held and " old · " in _pane_text(screen),
            "the hung call in the pane",
            WAIT_S,
        )
        text = _pane_text(screen)
        assert rid in text and "terminus-2" in text
        assert "agent" in text and "(now)" in text and "environment setup" in text
        assert "observation   (user)" in text, text  # the prompt terminus-2 sent

        await pilot.press("x")
        assert app.board.rollouts[rid].error_kind is None  # one press only asks
        await pilot.press("x")
        await until(
            pilot, lambda: app.board.rollouts[rid].error_kind == "cancelled", "the cancelled result", WAIT_S
        )
        await until(pilot, lambda: "cancelled" in _pane_text(screen), "the pane saying so", 10)

        rollout = app.board.rollouts[rid]
        assert rollout.error == "cancelled in phase agent" and rollout.phase == "failed"
        assert rollout.session_id is not None
        session = await app.client.session(rollout.session_id)
        assert session.state == "closed"  # the capture is kept
        assert (await app.client.run(run.id)).state == "finished"
        await until(pilot, lambda: not engine.held, "the hung engine call's end", 30)
