"""One line above the footer: connection state and the last problem, in words a person can act on."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static


class StatusLine(Static):
    """Mirrors the App's `status` / `status_level` reactives."""

    HELP = "Connection to the tapdeck server and the last error. Errors also appear as notifications."

    DEFAULT_CSS = """
    StatusLine { height: 1; background: $surface; color: $text-muted; padding: 0 1; }
    """

    def on_mount(self) -> None:
        self.watch(self.app, "status", self._show)
        self.watch(self.app, "status_level", self._show)

    def _show(self, _value: object = None) -> None:
        level = getattr(self.app, "status_level", "info")
        style = {"error": "bold $error", "warning": "$warning"}.get(level, "$text-muted")
        self.update(Content.styled(getattr(self.app, "status", ""), style))
