"""The live session table: keyed rows refreshed by diff (only changed cells are touched)."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual._two_way_dict import TwoWayDict
from textual.geometry import Region, Size
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, DuplicateKey, Row, RowKey

from tapdeck.app.views.sessions import (
    NARROW_BELOW,
    NARROW_HIDDEN,
    SERVER_COLUMN,
    SERVER_HIDDEN,
    SESSION_COLUMNS,
    WIDE_AT,
    WIDE_COLUMNS,
    Cell,
    diff_rows,
)

ALL_KEYS = [key for key, _, _ in (*SESSION_COLUMNS, *WIDE_COLUMNS, SERVER_COLUMN)]
"""The order of a row's cells (`SessionBoard.rows`, then `ServerLinks.session_rows`' server)."""
REMOVED_ONE_BY_ONE = 16
"""More rows gone than this (a filter typed) and the rows are laid out again instead: DataTable
renumbers every row on each `remove_row`, so removing most of 1,000 rows one by one took seconds."""


class SessionTable(DataTable):
    """`apply(rows)` makes the table show `rows` (key → cells) with the fewest changes."""

    HELP = (
        "Live capture sessions (and rollouts without one, shown as session '(none)'). "
        "Enter opens the rollout of "
        "the highlighted session. turn/root/fork = graph counts, tokens = trainable tokens, "
        "idle = seconds since the agent's last model call (60 s or more is highlighted). "
        "'all calls/s' above the table: every session's captured calls per second over the "
        "last two minutes, as this TUI saw them arrive."
    )

    def __init__(self, *, with_server: bool = False, **kwargs) -> None:
        """`with_server`: the TUI is attached to several servers (a server column first)."""
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.with_server = with_server
        self._shown: dict[str, tuple[Cell, ...]] = {}
        self._columns: tuple[tuple[str, str, int], ...] = ()
        self._given: dict[str, tuple[Cell, ...]] = {}
        """The rows as last given (every column, shown or not)."""
        self._unseen_changes = False
        """Cells changed in rows out of view since the rendering caches were last invalidated."""
        self._styled_rows: dict[str, tuple[tuple[Cell, ...], tuple[Text, ...]]] = {}
        """Each row's cells as `_styled` made them last, with the row (shown columns) made from."""

    def on_mount(self) -> None:
        self._set_columns()
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.restyle())

    def on_resize(self) -> None:
        highlighted = self._highlighted()
        if self._set_columns():
            self.restyle(highlighted)

    def _set_columns(self) -> bool:
        """The session columns (less NARROW_HIDDEN on a narrow terminal), plus WIDE_COLUMNS on a
        wide one, after the server column with several servers; True when they changed."""
        width = self.app.size.width
        wanted = SESSION_COLUMNS + (WIDE_COLUMNS if width >= WIDE_AT else ())
        dropped = self._dropped(width)
        wanted = ((SERVER_COLUMN,) if self.with_server else ()) + tuple(
            c for c in wanted if c[0] not in dropped
        )
        if wanted == self._columns:
            return False
        self.clear(columns=True)
        self._columns = wanted
        for key, label, width in wanted:
            self.add_column(label, key=key, width=width)
        return True

    def _dropped(self, width: int) -> tuple[str, ...]:
        """Keys of the columns a terminal `width` cells wide has no room for."""
        if width < NARROW_BELOW:
            return NARROW_HIDDEN
        return SERVER_HIDDEN if self.with_server and width < WIDE_AT else ()

    def hidden(self) -> tuple[list[str], int]:
        """Headers of the columns the terminal's width hides now, and the width that shows them."""
        dropped = self._dropped(self.app.size.width)
        shown_at = NARROW_BELOW if dropped == NARROW_HIDDEN and not self.with_server else WIDE_AT
        return [label for key, label, _ in SESSION_COLUMNS if key in dropped], shown_at

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        # Every column has a fixed width and every row one line, so there is nothing to measure:
        # DataTable's own pass renders and measures each cell of each new row (about half a
        # second for 1,000 rows laid out again). Only the scrollable size follows the rows.
        header = self.header_height if self.show_header else 0
        width = sum(column.get_render_width(self) for column in self.columns.values())
        self.virtual_size = Size(width, len(self.rows) + header)

    def _styled(self, cell: Cell) -> Text:
        # Always Text: DataTable parses a str cell as markup on every render of its row.
        text, tone = cell
        if not tone:
            return Text(text)
        theme = self.app.current_theme
        colour = {
            "error": theme.error,
            "success": theme.success,
            "accent": theme.accent,
            "warning": theme.warning,
            "muted": None,
            "idle": (theme.variables or {}).get("idle", theme.warning),
        }.get(tone)
        if tone == "idle":
            return Text(text, style=f"bold reverse {colour}")
        if tone == "muted" or colour is None:
            return Text(text, style="dim")
        return Text(text, style=colour)

    def apply(self, rows: dict[str, tuple[Cell, ...]]) -> int:
        """Diff against what is shown; returns how many cells/rows were touched."""
        given, self._given = self._given, dict(rows)
        columns = [key for key, _, _ in self._columns]
        picked = [ALL_KEYS.index(key) for key in columns]
        # A row given as the very object given last time (an ended session's, built once per
        # summary) is shown as it is: only the others are picked out and compared cell by cell.
        rows = {
            key: self._shown[key]
            if given.get(key) is row and key in self._shown
            else tuple(row[i] for i in picked)
            for key, row in rows.items()
        }
        diff = diff_rows(self._shown, rows)
        if not (diff.removed or diff.added or diff.changed) and list(rows) == list(self._shown):
            return 0
        kept = [key for key in self._shown if key in rows]
        highlighted, place = self._highlighted(), self.cursor_row
        if len(diff.removed) > REMOVED_ONE_BY_ONE:
            return self._relaid(rows)  # a filter dropped many
        with self.app.batch_update():
            for key in diff.removed:
                self.remove_row(key)
            if diff.changed:
                self._update_cells(diff.changed, columns)
            self._add_rows(diff.added)
            if kept + [key for key, _ in diff.added] != list(rows):
                self._reorder(list(rows), highlighted, place)  # a sort moved rows
        self._shown = dict(rows)
        return len(diff.removed) + len(diff.added) + len(diff.changed)

    def _add_rows(self, rows: Iterable[tuple[str, tuple[Cell, ...]]]) -> None:
        """Append `rows` (key, cells), as `add_row` would one by one: each of its calls checks the
        cursor, lists the columns and schedules a refresh, most of a tenth of a second for the
        1,000 rows an emptied filter brings back. A row given as the same object as when it was
        last added takes the same styled cells."""
        first = self.row_count
        columns = [column.key for column in self.ordered_columns]
        index = first
        for key, row in rows:
            row_key = RowKey(key)
            if row_key in self._row_locations:
                raise DuplicateKey(f"The row key {key!r} already exists.")
            styled = self._styled_rows.get(key)
            if styled is None or styled[0] is not row:
                styled = self._styled_rows[key] = (row, tuple(self._styled(c) for c in row))
            self._row_locations[row_key] = index
            self._data[row_key] = dict(zip(columns, styled[1], strict=True))
            self.rows[row_key] = Row(row_key, 1)
            self._new_rows.add(row_key)
            index += 1
        if index == first:
            return
        self._require_update_dimensions = True
        self._update_count += 1
        self.cursor_coordinate = self.cursor_coordinate  # kept within the rows, as add_row does
        if first == 0 and self.columns and self.show_cursor and self.cursor_type != "none":
            self._highlight_cursor()  # a cursor row where there was none: as add_row says so
        self.check_idle()
        self.refresh()

    def _update_cells(self, changed: list[tuple[str, int, Cell]], columns: list[str]) -> None:
        """Set the changed cells, repainting only the rows of them in view. DataTable's own
        `update_cell` repaints the whole table for each cell: with 256 live sessions a refresh
        changes hundreds of cells, mostly in rows scrolled out of view."""
        for key, index, cell in changed:
            self._data[RowKey(key)][ColumnKey(columns[index])] = self._styled(cell)
        header = self.header_height if self.show_header else 0
        top, height = self.scroll_offset.y, self.size.height - header
        places = (self._row_locations.get(RowKey(key)) for key, _, _ in changed)
        lines = {place - top for place in places if place is not None}
        shown = [Region(0, header + y, self.size.width, 1) for y in sorted(lines) if 0 <= y < height]
        if not shown:
            # The rendered cells and lines are cached under `_update_count`: changes out of view
            # move it only once they scroll into view, so that the rows in view stay cached.
            self._unseen_changes = True
            return
        self._update_count += 1
        self.refresh(*shown)  # (no region at all would repaint the whole table)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        if self._unseen_changes and round(old_value) != round(new_value):
            self._unseen_changes = False
            self._update_count += 1
        super().watch_scroll_y(old_value, new_value)

    def _reorder(self, keys: list[str], highlighted: str | None, place: int) -> None:
        """Put the rows (every one of them shown) in `keys`' order, the cursor staying on the
        session `highlighted` (or, that one gone, on the row now at `place`), as `_relaid` does:
        only their places change, as in DataTable's own `sort` (which orders by cell values
        only). Adding 1,000 rows again for each reorder took a tenth of a second."""
        self._row_locations = TwoWayDict({RowKey(key): index for index, key in enumerate(keys)})
        self._update_count += 1
        self.refresh()
        if keys:
            self.move_cursor(
                row=keys.index(highlighted) if highlighted in keys else min(place, len(keys) - 1)
            )

    def _relaid(self, rows: dict[str, tuple[Cell, ...]]) -> int:
        """Every row again in `rows`' order, the cursor staying on its session (or, that one
        filtered out, on the row now at its place)."""
        highlighted, place = self._highlighted(), self.cursor_row
        self.clear()
        with self.app.batch_update():
            self._add_rows(rows.items())
        self._shown = dict(rows)
        if rows:
            self.move_cursor(
                row=self.get_row_index(highlighted) if highlighted in rows else min(place, len(rows) - 1)
            )
        return len(rows)

    def restyle(self, highlighted: str | None = None) -> None:
        """Re-render every cell (after a theme change the tones map to new colours), the cursor
        staying on the session it was on (or on `highlighted`, read before the columns changed)."""
        highlighted = highlighted or self._highlighted()
        self._shown, self._styled_rows = {}, {}
        self.clear()
        self.apply(self._given)
        if highlighted is not None and highlighted in self._shown:
            self.move_cursor(row=self.get_row_index(highlighted))

    def _highlighted(self) -> str | None:
        """The key of the session under the cursor; None on an empty table."""
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
