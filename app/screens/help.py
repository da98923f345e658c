"""F1 / ? help: what the focused widget does, then the bundled help.md."""

from __future__ import annotations

from importlib import resources

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Markdown, Static

SCREENS_MARK = "<!-- screens -->"
KEYS_MARK = "<!-- keys -->"


def help_text(screens_table: str = "", keys_list: str = "") -> str:
    """The bundled help.md with its screens table and keys list filled in (generated from the
    screen registry and the bindings live now)."""
    text = resources.files("tapdeck.app").joinpath("help.md").read_text(encoding="utf-8")
    return text.replace(SCREENS_MARK, screens_table).replace(KEYS_MARK, keys_list)


class HelpScreen(ModalScreen[None]):
    """A modal over the current screen; Esc, q or F1 close it."""

    BINDINGS = [Binding("escape,q,f1,question_mark", "dismiss", "Close", id="help.close")]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; max-width: 100; height: 90%; border: round $primary;
                                  background: $surface; padding: 0 1; }
    HelpScreen #focused-help { color: $accent; margin-bottom: 1; }
    """

    def __init__(self, focused_help: str = "", screens_table: str = "", keys_list: str = "") -> None:
        super().__init__()
        self.focused_help = focused_help
        self.screens_table = screens_table
        self.keys_list = keys_list

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            if self.focused_help:
                yield Static(self.focused_help, id="focused-help", markup=False)
            yield Markdown(help_text(self.screens_table, self.keys_list))
        # Its own footer: the screen's below it would offer keys that do nothing while help is open.
        yield Footer()

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
