"""Keyed DataTable rows that a screen refills from the server's replies, its cursor staying put."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable


def cursor_key(table: DataTable) -> str | None:
    """The key of the row under the cursor; None on an empty table."""
    if table.row_count == 0:
        return None
    return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value


def show_rows(table: DataTable, rows: dict[str, tuple[str | Text, ...]]) -> None:
    """Make `table` show `rows` (key → cells, plain or styled, in order), its cursor staying on the
    same key.

    While the keys and their order stay (a run's update), only the changed cells are touched.
    Otherwise the rows are laid out again and the cursor goes back to its key or, that row gone,
    to the row now at its place."""
    key = cursor_key(table)
    if [row.key.value for row in table.ordered_rows] == list(rows):
        columns = [column.key for column in table.ordered_columns]
        for row_key, cells in rows.items():
            for column, cell, before in zip(columns, cells, table.get_row(row_key), strict=False):
                if cell != before:
                    table.update_cell(row_key, column, cell, update_width=True)
        return
    place = table.cursor_row
    table.clear()
    for row_key, cells in rows.items():
        table.add_row(*cells, key=row_key)
    if rows:
        table.move_cursor(row=table.get_row_index(key) if key in rows else min(place, len(rows) - 1))
