"""The live session table: keyed rows refreshed by diff (only changed cells are touched)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from tapdeck.app.views import SESSION_COLUMNS, Cell, diff_rows


class SessionTable(DataTable):
    """`apply(rows)` makes the table show `rows` (key → cells) with the fewest changes."""

    HELP = ("Live capture sessions (and rollouts without one, shown as session '(none)'). Enter opens the rollout of "
            "the highlighted session. turn/root/fork = graph counts, tokens = trainable tokens, "
            "idle = seconds since the agent's last model call (60 s or more is highlighted).")

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._shown: dict[str, tuple[Cell, ...]] = {}

    def on_mount(self) -> None:
        for key, label, width in SESSION_COLUMNS:
            self.add_column(label, key=key, width=width)

    def _styled(self, cell: Cell) -> Text | str:
        text, tone = cell
        if not tone:
            return text
        theme = self.app.current_theme
        colour = {"error": theme.error, "success": theme.success, "accent": theme.accent,
                  "warning": theme.warning, "muted": None,
                  "idle": (theme.variables or {}).get("idle", theme.warning)}.get(tone)
        if tone == "idle":
            return Text(text, style=f"bold reverse {colour}")
        if tone == "muted" or colour is None:
            return Text(text, style="dim")
        return Text(text, style=colour)

    def apply(self, rows: dict[str, tuple[Cell, ...]]) -> int:
        """Diff against what is shown; returns how many cells/rows were touched."""
        diff = diff_rows(self._shown, rows)
        if not (diff.removed or diff.added or diff.changed):
            return 0
        columns = [key for key, _, _ in SESSION_COLUMNS]
        with self.app.batch_update():
            for key in diff.removed:
                self.remove_row(key)
            for key, index, cell in diff.changed:
                self.update_cell(key, columns[index], self._styled(cell), update_width=False)
            for key, row in diff.added:
                self.add_row(*(self._styled(c) for c in row), key=key)
        self._shown = dict(rows)
        return len(diff.removed) + len(diff.added) + len(diff.changed)

    def restyle(self) -> None:
        """Re-render every cell (after a theme change the tones map to new colours)."""
        rows, self._shown = self._shown, {}
        self.clear()
        self.apply(rows)
