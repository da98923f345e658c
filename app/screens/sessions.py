"""Sessions: the live table of capture sessions, refreshed by diff from the event stream."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from textual import on
from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import DataTable, Static

from tapdeck.app.screens.base import TapdeckScreen
from tapdeck.app.widgets.session_table import SessionTable

REFRESH_HZ = 4


class SessionsScreen(TapdeckScreen):
    """Reads the App's `SessionBoard`; repaints at most REFRESH_HZ times a second, only changed cells."""

    MODE = "sessions"
    HELP = SessionTable.HELP

    BINDINGS = [Binding("enter", "open", "Open rollout", id="sessions.open", show=True)]

    def __init__(self) -> None:
        super().__init__()
        self._seen_version = -1
        self._seen_second = -1

    def compose_body(self) -> Iterable[Widget]:
        yield Static("", id="sessions-summary")
        yield SessionTable(id="sessions")

    def on_mount(self) -> None:
        self.refresh_table()
        self.set_interval(1 / REFRESH_HZ, self.refresh_table, name="sessions-refresh")

    def on_screen_resume(self) -> None:
        self.refresh_table(force=True)

    def refresh_table(self, force: bool = False) -> None:
        """Apply the board to the table if it changed (or a second passed: idle counters move)."""
        board = self.app.board
        now = self.app.clock()
        second = int(now)
        if not force and board.version == self._seen_version and second == self._seen_second:
            return
        self._seen_version, self._seen_second = board.version, second
        self.query_one(SessionTable).apply(board.rows(now))
        states = Counter(board.states())
        total = sum(states.values())
        summary = (f"{total} sessions · " + " · ".join(f"{n} {s}" for s, n in sorted(states.items()))
                   if total else "No capture sessions yet: start a batch on Setup (1).")
        self.query_one("#sessions-summary", Static).update(summary)

    def action_open(self) -> None:
        """Open the highlighted session on the Rollout screen."""
        table = self.query_one(SessionTable)
        if table.row_count == 0:
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        if key:
            self._open(key)

    def _open(self, key: str) -> None:
        if key in self.app.board.entries:
            self.app.open_rollout(key)
        else:
            self.app.notify("This rollout has no capture session (its harness makes no model calls).",
                            severity="warning")

    @on(DataTable.RowSelected, "#sessions")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self._open(event.row_key.value)
