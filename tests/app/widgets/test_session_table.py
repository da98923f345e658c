"""The session table widget: changed cells reach the screen whether their rows are in view or
scrolled into it later (it repaints only rows in view, and keeps the others' renders cached)."""

from __future__ import annotations

from textual.app import App, ComposeResult

from tapdeck.app.views.sessions import SESSION_COLUMNS, WIDE_COLUMNS, Cell
from tapdeck.app.widgets.session_table import SessionTable

ROWS = 200


class TableApp(App):
    def compose(self) -> ComposeResult:
        yield SessionTable()


def _row(i: int, idle: str) -> tuple[Cell, ...]:
    cells = {"session": f"s{i:04d}", "task": f"task-{i}", "idle": idle}
    return tuple((cells.get(key, "–"), "") for key, _, _ in (*SESSION_COLUMNS, *WIDE_COLUMNS))


def _line(table: SessionTable, key: str) -> str:
    """The text of `key`'s row as the screen shows it now (it must be in view)."""
    y = table.get_row_index(key) - table.scroll_offset.y + table.header_height
    return table.render_line(y).text


async def test_a_changed_cell_shows_in_view_and_after_scrolling_to_it() -> None:
    app = TableApp()
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.query_one(SessionTable)
        rows = {f"s{i:04d}": _row(i, "1") for i in range(ROWS)}
        table.apply(rows)
        await pilot.pause()
        assert "s0003" in _line(table, "s0003") and " 1 " in _line(table, "s0003")

        # One row in view and one far below it change: the one in view is drawn anew at once.
        last = f"s{ROWS - 1:04d}"
        rows = {**rows, "s0003": _row(3, "42"), last: _row(ROWS - 1, "77")}
        assert table.apply(rows) == 2
        await pilot.pause()
        assert " 42 " in _line(table, "s0003")

        # The other shows its new value once scrolled into view, and so does a later change to it.
        table.scroll_end(animate=False)
        await pilot.pause()
        assert " 77 " in _line(table, last)
        rows = {**rows, last: _row(ROWS - 1, "78")}
        table.apply(rows)
        await pilot.pause()
        assert " 78 " in _line(table, last)

        # A row drawn before, changed while scrolled out of view, is drawn anew once back in it.
        table.scroll_home(animate=False)
        await pilot.pause()
        assert " 1 " in _line(table, "s0004")
        table.scroll_end(animate=False)
        await pilot.pause()
        rows = {**rows, "s0004": _row(4, "55")}
        table.apply(rows)
        table.scroll_home(animate=False)
        await pilot.pause()
        assert " 55 " in _line(table, "s0004")
