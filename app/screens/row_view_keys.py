"""The filter and sort keys of a screen with a long table (Sessions, Runs), k9s-style: `/` filters as
you type, Esc clears it, `s` cycles the sort key and `S` reverses it, `!` puts stuck rows first.
Each screen's filter and sort are remembered in the settings file under its mode."""

from __future__ import annotations

from textual import on
from textual.binding import Binding
from textual.widgets import Input

from tapdeck.app.screens.base import TapdeckScreen
from tapdeck.app.views.row_view import RowView
from tapdeck.app.widgets.filter_bar import FilterBar, FilterInput

FILTER_PLACEHOLDER = "filter: words, state:… task:… run:… (Enter keeps, Esc clears)"


def row_view_bindings(prefix: str) -> list[Binding]:
    """The keys, with ids under `prefix` (a keymap rebinds them); off the footer, which must keep
    its room at 80 columns: help lists them."""
    return [
        Binding("slash", "filter", "Filter", show=False, id=f"{prefix}.filter"),
        Binding("escape", "clear_filter", "Clear filter", show=False, id=f"{prefix}.clear_filter"),
        Binding("s", "sort", "Sort by next column", show=False, id=f"{prefix}.sort"),
        Binding("S", "sort_reverse", "Reverse sort", show=False, id=f"{prefix}.sort_reverse"),
        Binding("exclamation_mark", "stuck_first", "Stuck first", show=False, id=f"{prefix}.stuck"),
    ]


class RowViewKeys(TapdeckScreen):
    """Mixed into a screen that yields a `FilterBar` and implements `view_changed()` (lay its
    table out again under `self.view`)."""

    def __init__(self) -> None:
        super().__init__()
        self.view = RowView()

    def on_mount(self) -> None:
        self.view = RowView.from_json(self.app.settings.views.get(self.MODE))

    def view_changed(self) -> None:
        raise NotImplementedError

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # While the filter is typed, Enter is the field's (Sessions binds it with priority).
        bar = next(self.query(FilterBar).results(), None)  # None before the screen is composed
        if action == "open" and bar is not None and bar.editing:
            return False
        return True

    def _set_view(self, view: RowView, *, save: bool = True) -> None:
        self.view = view
        self.view_changed()
        if save:
            self.app.settings.views[self.MODE] = view.to_json()
            self.app.settings.save(self.app.settings_path)

    def action_filter(self) -> None:
        """Open the filter's field on the filter in force."""
        self.query_one(FilterBar).edit(self.view.filter)

    def action_clear_filter(self) -> None:
        if self.view.filter:
            self._set_view(self.view.filtered(""))

    def action_sort(self) -> None:
        self._set_view(self.view.next_sort())

    def action_sort_reverse(self) -> None:
        self._set_view(self.view.flipped())

    def action_stuck_first(self) -> None:
        self._set_view(self.view.stuck_first())

    @on(Input.Changed, "FilterBar FilterInput")
    def _filter_typed(self, event: Input.Changed) -> None:
        if event.value != self.view.filter:
            self._set_view(self.view.filtered(event.value), save=False)  # saved once typed

    @on(Input.Submitted, "FilterBar FilterInput")
    def _filter_kept(self) -> None:
        self._close_filter()

    @on(FilterInput.Cleared)
    def _filter_cleared(self) -> None:
        self.view = self.view.filtered("")
        self._close_filter()

    def _close_filter(self) -> None:
        self.query_one(FilterBar).done()
        self._set_view(self.view)
        self.focus_table()

    def focus_table(self) -> None:
        """Give the focus back to the screen's table."""
        raise NotImplementedError
