"""The stuck-rollout pane under the Sessions table: what the highlighted session is doing now."""

from __future__ import annotations

from collections.abc import Sequence

from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import Static

from tapdeck.app.stuck_view import PaneLine

TONE_STYLES = {"error": "bold $error", "accent": "$accent", "warning": "$warning", "muted": "dim",
               "": "$foreground"}


class ActivityPane(VerticalScroll):
    """`show(lines)` replaces what the pane says (labels in a column, texts as literal text)."""

    HELP = ("The highlighted session's rollout: its phases and how long each took, the model call in "
            "flight and its age (60 s or more is highlighted), the last assistant message and tool "
            "call, the tail of what the agent was shown last, and findings. d hides it; x (twice) "
            "cancels the rollout: its sandbox is torn down, its capture kept, its result 'cancelled'.")

    DEFAULT_CSS = """
    ActivityPane { height: 45%; border-top: solid $primary; padding: 0 1; display: none; }
    ActivityPane.shown { display: block; }
    ActivityPane > Static { width: 1fr; }
    """

    def compose(self):
        yield Static("", id="activity-text")

    def show(self, lines: Sequence[PaneLine]) -> None:
        parts: list[tuple[str, str] | str] = []
        for i, line in enumerate(lines):
            if i:
                parts.append("\n")
            parts.append((f"{line.label:<14}", "bold $primary"))
            parts.append((line.text.replace("\n", "\n" + " " * 14), TONE_STYLES.get(line.tone, "")))
        self.query_one("#activity-text", Static).update(Content.assemble(*parts))
