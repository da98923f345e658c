"""SVG snapshots of every screen at 80×24 and 160×48 over recorded API bodies (no ports, no clocks).

Update after an intended change: `pytest tests/app/test_snapshots.py --snapshot-update`, then look at
the SVGs (rsvg-convert → PNG).
"""

from __future__ import annotations

import pytest
from textual.widgets import DataTable

from tapdeck.app.widgets.session_table import SessionTable
from tapdeck.app.widgets.token_view import TokenView
from tests.app.pilot_wait import until

SIZES = [(80, 24), (160, 48)]
SCREENS = ["setup", "sessions", "runs", "info"]
LOADED = {
    "setup": lambda screen: screen.catalog is not None,
    "sessions": lambda screen: screen.query_one(SessionTable).row_count == 6,
    "runs": lambda screen: screen.query_one("#groups-table", DataTable).row_count == 3,
    "info": lambda screen: screen.catalog is not None,
}
"""When each screen shows all of the recorded data."""


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
@pytest.mark.parametrize("mode", SCREENS)
def test_screen_snapshot(snap_compare, make_app, mode, size):
    async def settle(pilot):
        await until(pilot, lambda: LOADED[mode](pilot.app.screen), f"the {mode} screen's data")
        await pilot.pause(0.3)  # a refresh tick after the data, and any layout it causes
        await pilot.wait_for_scheduled_animations()

    assert snap_compare(make_app(mode), terminal_size=size, run_before=settle)


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
def test_rollout_snapshot_with_a_token_selected(snap_compare, make_app, size):
    async def open_and_pick(pilot):
        await until(pilot, lambda: LOADED["sessions"](pilot.app.screen), "the recorded sessions")
        pilot.app.open_rollout("sess0000recorded")
        await until(pilot, lambda: pilot.app.current_mode == "rollout"
                    and pilot.app.screen.query_one(TokenView).turn is not None, "turn 0")
        await pilot.pause(0.3)
        pilot.app.screen.query_one(TokenView).action_pick(2)
        await pilot.pause(0.2)
        await pilot.wait_for_scheduled_animations()

    assert snap_compare(make_app("sessions"), terminal_size=size, run_before=open_and_pick)


def test_help_snapshot(snap_compare, make_app):
    async def open_help(pilot):
        await pilot.pause(0.3)
        await pilot.press("f1")
        await pilot.pause(0.3)

    assert snap_compare(make_app("sessions"), terminal_size=(80, 24), run_before=open_help)


async def _sessions_loaded(pilot) -> None:
    await until(pilot, lambda: LOADED["sessions"](pilot.app.screen), "the recorded sessions")
    await pilot.pause(0.3)


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
def test_stuck_rollout_pane_snapshot(snap_compare, make_app, size):
    """Sessions, `d`: the highlighted session's call in flight (75 s: highlighted), its last
    exchange and phase, from the proxy's ActivityLog fed the recorded turns."""
    async def open_pane(pilot):
        await _sessions_loaded(pilot)
        await pilot.press("d")
        await until(pilot, lambda: "in flight" in str(pilot.app.screen.query_one("#activity-text").render()),
                    "the activity pane")
        await pilot.pause(0.3)
        await pilot.wait_for_scheduled_animations()

    assert snap_compare(make_app("sessions"), terminal_size=size, run_before=open_pane)


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x48"])
def test_train_screen_snapshot(snap_compare, make_app, size):
    """Sessions, then `6`: the Train screen (the recorded server has no training routes: it says so)."""
    async def to_train(pilot):
        await _sessions_loaded(pilot)
        await pilot.press("6")
        await until(pilot, lambda: pilot.app.current_mode == "train"
                    and "training API" in str(pilot.app.screen.query_one("#train-state").render()),
                    "the Train screen's state line")
        await pilot.pause(0.3)
        await pilot.wait_for_scheduled_animations()

    assert snap_compare(make_app("sessions"), terminal_size=size, run_before=to_train)


@pytest.mark.parametrize("mode_key", ["2", "4"], ids=["sessions", "runs"])
def test_light_theme_snapshot(snap_compare, make_app, mode_key):
    """`ctrl+t` to the light theme, then a screen by its key."""
    async def light(pilot):
        await _sessions_loaded(pilot)
        await pilot.press("ctrl+t", mode_key)
        await until(pilot, lambda: pilot.app.theme == "tapdeck-light", "the light theme")
        if mode_key == "4":
            await until(pilot, lambda: LOADED["runs"](pilot.app.screen), "the recorded runs")
        await pilot.pause(0.3)
        await pilot.wait_for_scheduled_animations()

    assert snap_compare(make_app("sessions"), terminal_size=(80, 24), run_before=light)
