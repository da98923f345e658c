"""The one-line bar on top of every screen: the screens by number (clickable) and where we are."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

SCREENS: tuple[tuple[str, str, str], ...] = (
    ("1", "setup", "Setup"), ("2", "sessions", "Sessions"), ("3", "rollout", "Rollout"),
    ("4", "runs", "Runs"), ("5", "info", "Info"), ("6", "train", "Train"),
)


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
        parts: list[tuple[str, str] | str] = [(" tapdeck ", "bold $primary")]
        for key, mode, title in SCREENS:
            style = f"@click=app.switch_mode('{mode}')"
            if mode == self.current:
                style = f"bold reverse $primary {style}"
            parts.append((f" {key} {title} ", style))
        self.update(Content.assemble(*parts))
