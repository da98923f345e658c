"""Filter and sort on Sessions and Runs at 80×24, over the recorded API: `/` filters as typed, Esc
clears, `s` cycles the sort key, `S` reverses it, `!` puts stuck rows first; the bar over the table
says what is in force, and each screen's is remembered in the settings file."""

from __future__ import annotations

import json
from pathlib import Path

from textual.widgets import DataTable, Static

from tapdeck.app.widgets.filter_bar import FilterBar, FilterInput
from tapdeck.app.widgets.session_table import SessionTable
from tests.support.pilot_wait import until

ALL = [f"sess{i:04d}recorded" for i in (0, 1, 2, 3, 4, 5, 6, 7)]
"""The recorded sessions in the table's own order (by start)."""


def _keys(table: DataTable) -> list[str]:
    return [str(row.key.value) for row in table.ordered_rows]


def _bar(app) -> str:
    """The filter and sort in force as the bar over the table shows them ("" while it is hidden,
    or holds the field being typed in)."""
    bar = app.screen.query_one(FilterBar)
    line = bar.query_one(Static)
    return str(line.render()) if bar.display and line.display else ""


async def _sessions_shown(pilot) -> SessionTable:
    table = pilot.app.screen.query_one(SessionTable)
    await until(pilot, lambda: table.row_count == len(ALL), "the recorded sessions")
    return table


async def test_slash_filters_the_sessions_as_typed_and_esc_clears_it(make_app):
    app = make_app("sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        table = await _sessions_shown(pilot)
        assert _keys(table) == ALL and _bar(app) == ""
        await pilot.press("slash", *"greet")
        assert isinstance(app.focused, FilterInput)
        await until(pilot, lambda: table.row_count == 3, "the filtered rows")
        assert _keys(table) == ["sess0001recorded", "sess0003recorded", "sess0005recorded"]
        assert _bar(app) == "" and app.screen.query_one(FilterInput).display  # the field, while typing
        summary = str(app.screen.query_one("#sessions-summary", Static).render())
        assert summary.startswith("8 sessions")  # the counts by state are every session's
        await pilot.press("escape")
        await until(pilot, lambda: table.row_count == len(ALL), "every row again")
        assert app.focused is table and not app.screen.query_one(FilterBar).display


async def test_a_state_prefix_narrows_enter_keeps_the_filter_and_esc_on_the_table_clears_it(make_app):
    app = make_app("sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        table = await _sessions_shown(pilot)
        await pilot.press("slash", *"state:running", "enter")
        await until(pilot, lambda: table.row_count == 2, "the running sessions")
        # "running" in a task or run name would not count: only the state column is read.
        assert _keys(table) == ["sess0000recorded", "sess0007recorded"]
        assert app.focused is table
        assert _bar(app) == "/ state:running (2 of 8)"
        await pilot.press("slash")  # opens on the filter in force
        assert app.screen.query_one(FilterInput).value == "state:running"
        await pilot.press("enter", "escape")
        await until(pilot, lambda: table.row_count == len(ALL), "every row again")
        assert _bar(app) == ""


async def test_s_cycles_the_sort_shift_s_reverses_it_and_bang_puts_stuck_first(make_app):
    app = make_app("sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        table = await _sessions_shown(pilot)
        await pilot.press("s")
        await until(pilot, lambda: _bar(app) == "sort idle ↓", "the idle sort")
        # The live sessions by time since their last call (73 s, 2 s), then the rest as they were.
        assert _keys(table)[:2] == ["sess0000recorded", "sess0007recorded"]
        assert _keys(table)[2:] == [k for k in ALL if k not in ("sess0000recorded", "sess0007recorded")]
        await pilot.press("S")
        await until(pilot, lambda: _bar(app) == "sort idle ↑", "the idle sort reversed")
        assert _keys(table)[:2] == ["sess0007recorded", "sess0000recorded"]
        await pilot.press("s")
        await until(pilot, lambda: _bar(app) == "sort calls ↓", "the calls sort")
        assert _keys(table)[0] == "sess0000recorded"  # 3 calls
        assert _keys(table)[-2:] == ["sess0003recorded", "sess0006recorded"]  # none
        await pilot.press("s", "s", "s")
        await until(pilot, lambda: _bar(app) == "sort state ↑", "the state sort")
        assert _keys(table)[0] == "sess0003recorded"  # failed, first of the alphabet
        await pilot.press("exclamation_mark")
        await until(pilot, lambda: _bar(app) == "stuck first", "stuck first")
        assert _keys(table)[:2] == ["sess0000recorded", "sess0007recorded"]
        await pilot.press("exclamation_mark")
        await until(pilot, lambda: _bar(app) == "", "the table's own order")
        assert _keys(table) == ALL


async def test_the_filter_and_sort_are_remembered_per_screen_in_the_settings_file(make_app, tmp_path: Path):
    settings = tmp_path / "tui.json"
    app = make_app("sessions", settings_path=settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await _sessions_shown(pilot)
        await pilot.press("slash", *"hello", "enter", "s", "s")
        await until(pilot, lambda: "sort calls" in _bar(app), "the calls sort")
    saved = json.loads(settings.read_text())["views"]
    assert saved == {"sessions": {"filter": "hello", "sort": "calls", "reverse": False}}
    again = make_app("sessions", settings_path=settings)
    async with again.run_test(size=(80, 24)) as pilot:
        table = pilot.app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == 3, "the remembered filter")
        assert _keys(table) == ["sess0000recorded", "sess0002recorded", "sess0004recorded"]
        assert _bar(again) == "/ hello (3 of 8) · sort calls ↓"
        await pilot.press("4")  # Runs has its own: none
        rollouts = again.screen.query_one("#rollouts-table", DataTable)
        await until(pilot, lambda: rollouts.row_count == 4, "every rollout of the run")
        assert _bar(again) == ""


async def test_a_link_in_the_settings_files_place_is_not_written_through(make_app, tmp_path: Path):
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}")
    (tmp_path / "tui.json").symlink_to(elsewhere)
    app = make_app("sessions", settings_path=tmp_path / "tui.json")
    async with app.run_test(size=(80, 24)) as pilot:
        await _sessions_shown(pilot)
        await pilot.press("s")
        await until(pilot, lambda: _bar(app) == "sort idle ↓", "the idle sort, in force though unsaved")
    assert elsewhere.read_text() == "{}"
    assert (tmp_path / "tui.json").is_symlink()


async def test_runs_filters_and_sorts_the_runs_rollouts(make_app):
    app = make_app("runs")
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one("#rollouts-table", DataTable)
        await until(pilot, lambda: table.row_count == 4, "the run's rollouts")
        by_task = _keys(table)
        assert by_task == ["run-0001.g001r00", "run-0001.g001r01", "run-0001.g000r00", "run-0001.g000r01"]
        await pilot.press("slash", *"task:hello", "enter")
        await until(pilot, lambda: table.row_count == 2, "the hello-file rollouts")
        assert all(str(table.get_cell(key, "task")) == "hello-file" for key in table.rows)
        assert _bar(app) == "/ task:hello (2 of 4)"
        await pilot.press("escape", "s", "s")
        await until(pilot, lambda: _bar(app) == "sort calls ↓", "the calls sort")
        calls = [int(str(table.get_cell_at((row, 4)))) for row in range(table.row_count)]
        assert calls == sorted(calls, reverse=True) and table.row_count == 4
        await pilot.press("S")
        await until(pilot, lambda: _bar(app) == "sort calls ↑", "the calls sort reversed")
        calls = [int(str(table.get_cell_at((row, 4)))) for row in range(table.row_count)]
        assert calls == sorted(calls)
