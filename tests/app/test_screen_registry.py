"""One screen registry: the number keys, nav bar, palette and help come from it, and help and the
nav bar show the keys bound now (a keymap change shows in both)."""

from __future__ import annotations

import json

import pytest

from tapdeck.app.screen_registry import SCREENS
from tapdeck.app.screens.help import HelpScreen
from tapdeck.app.tui import TapdeckApp, TapdeckCommands
from tapdeck.app.widgets.nav_bar import NavBar
from tapdeck.app.widgets.session_table import SessionTable
from tests.support.pilot_wait import until


def test_every_screen_has_a_number_key_a_binding_and_a_palette_entry() -> None:
    ids = {b.id: b for b in TapdeckApp.BINDINGS}
    assert [e.mode for e in SCREENS] == ["setup", "sessions", "rollout", "runs", "info", "train"]
    for entry in SCREENS:
        assert ids[entry.binding_id].key == entry.key
        assert ids[entry.binding_id].action == f"switch_mode('{entry.mode}')"


@pytest.mark.medium
async def test_a_rebound_key_shows_in_help_and_the_nav_bar(make_app, api_data, tmp_path) -> None:
    settings = tmp_path / "tui.json"
    settings.write_text(json.dumps({"keymap": {"app.runs": "7", "app.help": "f2", "sessions.details": "i"}}))
    app = make_app("sessions", settings_path=settings)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(
            pilot,
            lambda: app.screen.query_one(SessionTable).row_count == len(api_data["sessions"]),
            "the sessions",
        )
        assert " 7 Runs " in str(app.screen.query_one(NavBar).render())
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "help on the rebound key")
        help_screen = app.screen
        assert "| 7 | Runs |" in help_screen.screens_table and "| 4 |" not in help_screen.screens_table
        assert "| 6 | Train |" in help_screen.screens_table
        assert "`f2` Help" in help_screen.keys_list
        assert "- Sessions: " in help_screen.keys_list and "`i` Details" in help_screen.keys_list
        await pilot.press("escape")
        await pilot.press("7")
        await until(pilot, lambda: app.current_mode == "runs", "Runs on its rebound key")
        titles = [name for name, _, _ in TapdeckCommands(app.screen)._commands() if name.startswith("Go to")]
        assert titles == [f"Go to {e.title}" for e in SCREENS]
