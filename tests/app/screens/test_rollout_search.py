"""`/` search over turn text on Rollout at 80×24, over the recorded API: the first turn found is
shown as the query is typed, n / N step through the found turns, Esc clears the search."""

from __future__ import annotations

from textual.widgets import Static

from tapdeck.app.widgets.filter_bar import FilterBar, FilterInput
from tapdeck.app.widgets.rollout_tree import RolloutTree
from tapdeck.app.widgets.session_table import SessionTable
from tapdeck.app.widgets.token_view import TokenView
from tests.support.pilot_wait import until


def _bar(app) -> str:
    bar = app.screen.query_one(FilterBar)
    line = bar.query_one(Static)
    return str(line.render()) if bar.display and line.display else ""


def _shown(app) -> int | None:
    turn = app.screen.query_one(TokenView).turn
    return None if turn is None else turn.seq


async def test_slash_searches_turn_text_n_steps_through_the_found_turns_and_esc_clears(make_app):
    app = make_app("sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == 8, "the recorded sessions")
        await pilot.press("enter")  # sess0000recorded: turns 0 and 1 answer "SET alarm", 2 is asked to show
        await until(pilot, lambda: app.current_mode == "rollout" and _shown(app) == 0, "turn 0 on Rollout")
        await pilot.press("slash", *"show the file")
        assert isinstance(app.focused, FilterInput)
        # Only turn 2 was told it: the later prompts holding earlier messages do not count.
        await until(pilot, lambda: _shown(app) == 2, "the found turn shown")
        await pilot.press("enter")
        assert isinstance(app.focused, RolloutTree)
        await until(pilot, lambda: _bar(app) == "/ show the file: turn 1 of 1 (#2)", "the search line")
        await pilot.press("slash", *("backspace",) * len("show the file"), *"alarm", "enter")
        await until(pilot, lambda: _shown(app) == 0, "the first of the turns found (#2 is not one)")
        assert _bar(app) == "/ alarm: turn 1 of 2 (#0)"
        await pilot.press("n")
        await until(pilot, lambda: _shown(app) == 1, "the next found turn")
        assert _bar(app) == "/ alarm: turn 2 of 2 (#1)"
        await pilot.press("n")
        await until(pilot, lambda: _shown(app) == 0, "round the end to the first")
        await pilot.press("N")
        await until(pilot, lambda: _shown(app) == 1, "back round to the last")
        await pilot.press("escape")
        await until(pilot, lambda: _bar(app) == "", "the search cleared")
        assert not app.screen.query_one(FilterBar).display
