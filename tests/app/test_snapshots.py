"""SVG snapshots of every screen, reached by key presses from the App's start (it opens on Sessions:
the recorded server has sessions), over the API bodies `python -m tests.app.record` recorded from a
real server (no ports, no clocks). Each screen in the dark and the light theme at 80×24, and in the
dark theme at 160×48. The drift shots add a replay of each session (tests/support/recorded_replays.py:
the recording has none).

Update after an intended change (or a new recording): `pytest tests/app/test_snapshots.py
--snapshot-update`, then look at the SVGs (rsvg-convert → PNG).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from textual.command import CommandList, CommandPalette
from textual.widgets import DataTable, Input

from tapdeck.app.screen_registry import SCREENS
from tapdeck.app.screens.drift import RunDriftScreen
from tapdeck.app.screens.help import HelpScreen
from tapdeck.app.screens.sandbox import SandboxScreen
from tapdeck.app.widgets.session_table import SessionTable
from tapdeck.app.widgets.token_view import TokenView
from tests.support.pilot_wait import until
from tests.support.recorded_replays import with_replays
from tests.support.recorded_sandbox import with_sandbox

SESSIONS = 8
"""Sessions in the recording (the App's first screen shows them all)."""
REPLAYED = tuple(f"sess000{i}recorded" for i in (0, 1, 2, 4, 5, 7))
"""The recorded sessions with sampled tokens: the ones the drift shots give a replay."""


def _text(screen, selector: str) -> str:
    return str(screen.query_one(selector).render())


@dataclass(frozen=True)
class Shot:
    """Keys pressed once Sessions shows the recording, and when the screen they lead to is ready;
    then `then` keys, pressed once it is (they act on what it loaded), and when they have acted."""

    keys: tuple[str, ...]
    ready: Callable[[object], bool]
    then: tuple[str, ...] = ()
    done: Callable[[object], bool] | None = None
    replays: bool = False
    """Over the recording with a replay of each session (tests/support/recorded_replays.py)."""
    sandbox: bool = False
    """Over the recording with each rollout's sandbox answering (tests/support/recorded_sandbox.py)."""


SHOTS: dict[str, Shot] = {
    "sessions": Shot((), lambda app: app.current_mode == "sessions"),
    # The newest session (the last row) has a call hanging in its engine.
    "sessions-detail": Shot(
        ("ctrl+end", "d"), lambda app: "in flight" in _text(app.screen, "#activity-text")
    ),
    # The first row: a chat with a discarded root and a child; two tokens stepped (once its
    # first turn is shown: a step before that does nothing).
    "rollout": Shot(
        ("enter",),
        lambda app: app.current_mode == "rollout" and app.screen.query_one(TokenView).turn is not None,
        then=("full_stop", "full_stop"),
        done=lambda app: app.screen.query_one(TokenView).selected == 1,
    ),
    # The same, coloured by drift against a replay; the token whose ratio leaves [0.5, 2] picked.
    "rollout-drift": Shot(
        ("enter",),
        lambda app: app.current_mode == "rollout" and app.screen.query_one(TokenView).pair is not None,
        then=("c", *["full_stop"] * 8),
        done=lambda app: app.screen.query_one(TokenView).selected == 7,
        replays=True,
    ),
    "sessions-detail-drift": Shot(
        ("ctrl+end", "d"),
        lambda app: "vs smollm2@embedded" in _text(app.screen, "#activity-text"),
        replays=True,
    ),
    # Typed and kept, then sorted by calls: the bar over the table says both.
    "sessions-filtered": Shot(
        ("slash", *"hello", "enter", "s", "s"),
        lambda app: _text(app.screen, "FilterBar Static") == "/ hello (3 of 8) · sort calls ↓",
    ),
    "runs-filtered": Shot(
        ("4",),
        lambda app: (
            app.current_mode == "runs" and app.screen.query_one("#groups-table", DataTable).row_count == 2
        ),
        then=("slash", *"greet", "enter", "S"),
        done=lambda app: _text(app.screen, "FilterBar Static") == "/ greet (2 of 4) · sort idle ↑",
    ),
    # The first row's rollout, searched: turn #2 is the one told to show the file.
    "rollout-search": Shot(
        ("enter",),
        lambda app: app.current_mode == "rollout" and app.screen.query_one(TokenView).turn is not None,
        then=("slash", *"show the file", "enter"),
        done=lambda app: _text(app.screen, "FilterBar Static") == "/ show the file: turn 1 of 1 (#2)",
    ),
    "setup": Shot(("1",), lambda app: app.current_mode == "setup" and app.screen.catalog is not None),
    "runs": Shot(
        ("4",),
        lambda app: (
            app.current_mode == "runs" and app.screen.query_one("#groups-table", DataTable).row_count == 2
        ),
    ),
    "runs-drift": Shot(
        ("4",),
        lambda app: (
            app.current_mode == "runs" and app.screen.query_one("#groups-table", DataTable).row_count == 2
        ),
        then=("d",),
        done=lambda app: isinstance(app.screen, RunDriftScreen) and app.screen.deltas is not None,
        replays=True,
    ),
    # The highlighted rollout's processes and agent output.
    "runs-sandbox": Shot(
        ("4",),
        lambda app: (
            app.current_mode == "runs" and app.screen.query_one("#groups-table", DataTable).row_count == 2
        ),
        then=("l",),
        done=lambda app: isinstance(app.screen, SandboxScreen) and app.screen.output is not None,
        sandbox=True,
    ),
    "info": Shot(("5",), lambda app: app.current_mode == "info" and app.screen.catalog is not None),
    # Train opens on the last training run: a data-check of the terminus-2 batch.
    "train": Shot(
        ("6",),
        lambda app: (
            app.current_mode == "train" and "finished (exit code 0)" in _text(app.screen, "#train-state")
        ),
    ),
    "help": Shot(("f1",), lambda app: isinstance(app.screen, HelpScreen)),
    # Hits stream in as the query is typed: ready once the whole query has every screen's entry.
    "palette": Shot(
        ("ctrl+p", *"go to"),
        lambda app: (
            isinstance(app.screen, CommandPalette)
            and app.screen.query_one(Input).value == "go to"
            and app.screen.query_one(CommandList).option_count == len(SCREENS)
        ),
    ),
}
LOOKS = {"dark-80x24": ((), (80, 24)), "light-80x24": (("ctrl+t",), (80, 24)), "dark-160x48": ((), (160, 48))}


@pytest.mark.parametrize("look", LOOKS)
@pytest.mark.parametrize("shot", SHOTS)
def test_screen_snapshot(snap_compare, make_app, api_data, shot, look):
    theme_keys, size = LOOKS[look]
    wanted = SHOTS[shot]

    async def press_to(pilot):
        app = pilot.app
        await until(
            pilot,
            lambda: (
                app.current_mode == "sessions" and app.screen.query_one(SessionTable).row_count == SESSIONS
            ),
            "the recorded sessions",
        )
        await pilot.press(*theme_keys, *wanted.keys)
        await until(pilot, lambda: wanted.ready(app), f"the {shot} screen")
        if wanted.then:
            await pilot.press(*wanted.then)
            await until(pilot, lambda: wanted.done(app), f"the {shot} screen after {wanted.then}")
        for field in app.screen.query(Input):
            field.cursor_blink = False  # a blinking cursor is drawn or not by the clock
        await pilot.pause(0.3)  # a refresh tick after the data, and any layout it causes
        await pilot.wait_for_scheduled_animations()

    data = with_replays(api_data, stored=REPLAYED) if wanted.replays else None
    data = with_sandbox(api_data) if wanted.sandbox else data
    assert snap_compare(make_app(None, data=data), terminal_size=size, run_before=press_to)
