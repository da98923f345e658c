"""The stuck-rollout pane under the Sessions table: what the highlighted session is doing now."""

from __future__ import annotations

from collections.abc import Sequence

from textual.containers import Horizontal, VerticalScroll
from textual.content import Content
from textual.widgets import Sparkline, Static

from tapdeck.app.stuck_view import PaneLine
from tapdeck.app.widgets.labelled_fields import LabelledFields, LabelledFieldsText

TONE_STYLES = {
    "error": "bold $error",
    "accent": "$accent",
    "warning": "$warning",
    "muted": "dim",
    "": "$foreground",
}
LABEL_WIDTH = 14


class ActivityPane(VerticalScroll):
    """`show(lines)` replaces what the pane says (labels in a column, texts as literal text beside
    them: a text's continuation lines stay in its column)."""

    HELP = (
        "The highlighted session's rollout: its phases and how long each took, the model call in "
        "flight and its age (60 s or more is highlighted), the last assistant message and tool "
        "call, the tail of what the agent was shown last, and findings. d hides it; x (twice) "
        "cancels the rollout: its sandbox is torn down, its capture kept, its result 'cancelled'."
    )

    DEFAULT_CSS = """
    ActivityPane { height: 45%; border-top: solid $primary; padding: 0 1; display: none; }
    ActivityPane.shown { display: block; }
    ActivityPane > Static { width: 1fr; }
    ActivityPane #calls-rate-row { height: 1; }
    ActivityPane #calls-rate-label { width: 14; color: $primary; text-style: bold; }
    ActivityPane #calls-rate { width: 1fr; height: 1; }
    ActivityPane #calls-rate-span { width: auto; padding-left: 1; color: $text-muted; }
    """

    def compose(self):
        with Horizontal(id="calls-rate-row"):
            yield Static("calls/s", id="calls-rate-label")
            # Textual's own Sparkline, not textual-plotext: one row that fits 80×24 under the table,
            # drawn in the theme's colours; plotext needs axes and five rows to say as much.
            yield Sparkline([], id="calls-rate")
            yield Static("", id="calls-rate-span")
        yield LabelledFieldsText("", id="activity-text")

    def show(self, lines: Sequence[PaneLine], rates: Sequence[float] = (), span: str = "") -> None:
        """Replace the pane's lines, and its calls-per-second line (`rates`, oldest first)."""
        self.query_one("#calls-rate", Sparkline).data = list(rates)
        self.query_one("#calls-rate-span", Static).update(span)
        fields = [(line.label, Content.styled(line.text, TONE_STYLES.get(line.tone, ""))) for line in lines]
        self.query_one("#activity-text", Static).update(LabelledFields(fields, LABEL_WIDTH, "bold $primary"))
