"""The footer of tapdeck's screens: Textual's, laid out again only when the keys it shows change."""

from __future__ import annotations

from collections.abc import Hashable

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer


class KeyFooter(Footer):
    """Textual's Footer removes and mounts all its keys again whenever the screen's bindings are
    refreshed (each focus change, each switch between screens), which restyles every key: a
    tenth of a second of a busy TUI's screen switch. This one does so only when what it would
    show differs from what it shows."""

    def __init__(self) -> None:
        super().__init__()
        self._composed: Hashable = None
        """What the keys shown were made from (`_shown`); None before any were."""

    def _shown(self) -> Hashable:
        """Everything of the screen's bindings that `Footer.compose` draws."""
        app = self.app
        keys = tuple(
            (
                binding.key,
                app.get_key_display(binding),
                binding.description,
                binding.action,
                binding.group,
                enabled,
                tooltip,
            )
            for (_, binding, enabled, tooltip) in self.screen.active_bindings.values()
            if binding.show or binding.key == app.COMMAND_PALETTE_BINDING
        )
        return keys, self.show_command_palette and app.ENABLE_COMMAND_PALETTE

    def compose(self) -> ComposeResult:
        self._composed = self._shown() if self._bindings_ready else None
        yield from super().compose()

    def bindings_changed(self, screen: Screen) -> None:
        if (
            self._composed is not None
            and self.is_attached
            and screen is self.screen
            and self._shown() == self._composed
        ):
            return
        super().bindings_changed(screen)
