"""What every tapdeck screen shares: the nav bar on top, the status line and footer below."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from textual import getters
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widget import Widget
from textual.worker import Worker

from tapdeck.app.widgets.key_footer import KeyFooter
from tapdeck.app.widgets.nav_bar import NavBar
from tapdeck.app.widgets.status_line import StatusLine

if TYPE_CHECKING:
    from tapdeck.app.client import TapdeckClient
    from tapdeck.app.tui import TapdeckApp


class TapdeckScreen(Screen):
    """Subclasses set `MODE` and implement `compose_body()`."""

    MODE = ""
    HELP = ""

    if TYPE_CHECKING:
        # `self.app` typed as tapdeck's App, as Textual types its own `app`. For the checker only:
        # tui.py imports the screens, and a test may host one screen in a bare App.
        app = getters.app(TapdeckApp)

    def compose(self) -> ComposeResult:
        yield NavBar(self.MODE)
        yield from self.compose_body()
        yield StatusLine()
        yield KeyFooter()

    def compose_body(self) -> Iterable[Widget]:
        return ()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # Worker.StateChanged does not bubble: without this, a failed action on a screen is silent.
        self.app.report_worker_failure(event)

    @property
    def client(self) -> TapdeckClient:
        """The app's `TapdeckClient`."""
        return self.app.client
