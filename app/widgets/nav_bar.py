"""The one-line bar on top of every screen: the screens by key (clickable) and where we are.

The screens and their keys come from the App (`nav_entries()`: the screen registry and the keys bound
now), so a keymap change shows here too."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import getters
from textual.content import Content
from textual.widgets import Static

if TYPE_CHECKING:
    from tapdeck.app.tui import TapdeckApp


TARGETED = ("setup", "info", "train")
"""The screens that work on one server (`ServerLinks.target`) when the TUI is attached to several."""


class NavBar(Static):
    """Screen tabs; `current` is the mode name of the screen it sits on."""

    HELP = "Click a screen name or press its number to switch screens."

    if TYPE_CHECKING:
        app = getters.app(TapdeckApp)  # for the checker only, as on TapdeckScreen

    DEFAULT_CSS = """
    NavBar { height: 1; background: $panel; color: $foreground; }
    """

    def __init__(self, current: str) -> None:
        super().__init__()
        self.current = current

    def on_mount(self) -> None:
        self.show_keys()

    def on_resize(self) -> None:
        self.show_keys()

    def show_keys(self) -> None:
        """Draw the tabs with the keys bound now (again after a keymap change), as much of them
        as fits: without the name, then the other screens by key only, never a cut-off title."""
        entries = self.app.nav_entries()
        width = self.size.width or self.app.size.width
        for brand, titled in ((True, True), (False, True), (False, False)):
            parts: list[tuple[str, str]] = [(" tapdeck ", "bold $primary")] if brand else []
            for key, mode, title in entries:
                style = f"@click=app.switch_mode('{mode}')"
                if mode == self.current:
                    style = f"bold reverse $primary {style}"
                if mode == self.current and mode in TARGETED and self.app.links.several:
                    title = f"{title} on {self.app.links.target.name}"  # which server it acts on
                shown = f" {key} {title} " if titled or mode == self.current else f" {key} "
                parts.append((shown, style))
            if sum(len(text) for text, _ in parts) <= width:
                break
        self.update(Content.assemble(*parts))
