"""One line over a table: the filter being typed (after `/`), else the filter and sort in force.
Hidden while there is neither, so a table with none looks as it always did."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Input, Static


class FilterInput(Input):
    """The filter's field: Enter keeps what was typed, Esc clears it (both give focus back)."""

    BINDINGS = [Binding("escape", "clear", "Clear filter", show=False, id="filter.clear")]

    class Cleared(Message):
        """Esc in the field."""

    def action_clear(self) -> None:
        self.value = ""
        self.post_message(self.Cleared())


class FilterBar(Widget):
    """`edit(text)` opens the field; `show(line)` says what is in force. The screen owns the filter:
    it listens to the field's Input.Changed / Input.Submitted and FilterInput.Cleared."""

    DEFAULT_CSS = """
    FilterBar { height: 1; display: none; padding: 0 1; }
    FilterBar.-shown { display: block; }
    FilterBar Static { color: $accent; }
    FilterBar FilterInput { border: none; height: 1; padding: 0; }
    FilterBar.-editing Static { display: none; }
    """

    def __init__(self, placeholder: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self._placeholder = placeholder
        self._line = ""

    def compose(self) -> ComposeResult:
        yield Static("", markup=False)

    @property
    def editing(self) -> bool:
        return self.has_class("-editing")

    def edit(self, text: str) -> None:
        """Open the field on `text`, the cursor at its end. It is mounted only while it is open:
        a hidden Input in the screen takes key presses meant for the App under `App.run`."""
        self.add_class("-editing", "-shown")
        fields = self.query(FilterInput)
        if fields:
            fields.first().focus()
            return
        field = FilterInput(value=text, placeholder=self._placeholder, compact=True)
        self.mount(field)
        field.focus()

    def done(self) -> None:
        """Close the field (what it held stays the filter)."""
        self.remove_class("-editing")
        self.query(FilterInput).remove()
        self.set_class(bool(self._line), "-shown")

    def show(self, line: str) -> None:
        """What is in force ("" hides the bar unless the field is open)."""
        if line != self._line:  # (an update lays the screen out again: Sessions shows it 4 times a second)
            self.query_one(Static).update(line)
        self._line = line
        self.set_class(bool(line) or self.editing, "-shown")
