"""The one-line bar on top of every screen: the screens by key (clickable) and where we are.

The screens and their keys come from the App (`nav_entries()`: the screen registry and the keys bound
now), so a keymap change shows here too."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static


class NavBar(Static):
    """Screen tabs; `current` is the mode name of the screen it sits on."""

    HELP = "Click a screen name or press its number to switch screens."

    DEFAULT_CSS = """
    NavBar { height: 1; background: $panel; color: $foreground; }
    """

    def __init__(self, current: str) -> None:
        super().__init__()
        self.current = current

    def on_mount(self) -> None:
        self.show_keys()

    def show_keys(self) -> None:
        """Draw the tabs with the keys bound now (again after a keymap change)."""
        parts: list[tuple[str, str] | str] = [(" tapdeck ", "bold $primary")]
        for key, mode, title in self.app.nav_entries():
            style = f"@click=app.switch_mode('{mode}')"
            if mode == self.current:
                style = f"bold reverse $primary {style}"
            parts.append((f" {key} {title} ", style))
        self.update(Content.assemble(*parts))
