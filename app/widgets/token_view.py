"""A turn's sampled tokens coloured by logprob, or by drift against a replay's reference; click (or
, and .) to inspect one token."""

from __future__ import annotations

from typing import Any

from textual.content import Content
from textual.message import Message
from textual.widgets import Static

from tapdeck.app.views.drift import drift_tone, token_deltas
from tapdeck.app.views.tokens import logprob_tone, token_display
from tapdeck.schema.replay import ReplayTurnLogprobs
from tapdeck.schema.sessions import TurnDetail

TONE_STYLES = {
    "sure": "",
    "mid": "on $logprob-mid",
    "low": "on $logprob-low",
    "vlow": "bold on $logprob-vlow",
    "masked": "italic strike $logprob-masked",
}

DRIFT_STYLES = {
    "same": "",
    "small": "on $logprob-mid",
    "mid": "on $logprob-low",
    "outside": "bold on $logprob-vlow",
    "unscored": "italic $logprob-masked",
    "masked": "italic strike $logprob-masked",
}
"""The logprob colours again, by |Δ| this time: the further apart the engines, the hotter."""


class TokenView(Static, can_focus=True):
    """Sampled tokens of one turn. Background = how unlikely the token was; struck-through = masked."""

    HELP = (
        "Sampled tokens coloured by logprob: no background ≥ -0.1, yellow ≥ -1, orange ≥ -3, "
        "red below (low-probability tokens stand out). Struck-through grey = masked (no "
        "aligned logprob, not trained on). Click a token or use , and . to see its logprob "
        "and the top alternatives. In drift colouring (after a replay) the background is |Δ| "
        "between the reference's and the sampler's logprob: none under 0.05, yellow under 0.3, "
        "orange under ln 2, red from ln 2 (the ratio leaves [0.5, 2]); grey italic = not scored."
    )

    DEFAULT_CSS = """
    TokenView { link-style: not underline; link-color: $foreground; link-background: transparent;
                link-style-hover: bold not underline; link-background-hover: $primary 40%; }
    """

    class Picked(Message):
        """A token was selected (click or keys)."""

        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.turn: TurnDetail | None = None
        self.selected: int | None = None
        self.pair: ReplayTurnLogprobs | None = None
        """The shown turn's logprobs under the replay (None: no replay scored it)."""
        self.drift = False
        """Colour by Δ against the replay instead of by logprob."""

    def show(
        self, turn: TurnDetail | None, keep_selection: bool = False, pair: ReplayTurnLogprobs | None = None
    ) -> None:
        """Show a turn (the `GET /admin/sessions/{id}/turns/{seq}` body) and its replay's logprobs.
        `keep_selection`: the same turn shown again (a refresh), so the token the operator picked
        stays picked."""
        count = 0 if turn is None else len(turn.token_texts or turn.sampled_ids or [])
        if not keep_selection or self.selected is None or self.selected >= count:
            self.selected = None
        self.turn = turn
        self.pair = pair
        self._paint()

    def colour_by(self, drift: bool) -> None:
        """Colour by Δ (True) or by logprob."""
        self.drift = drift
        self._paint()

    def _paint(self) -> None:
        turn = self.turn
        if not turn:
            self.update(Content.styled("Select a turn in the graph to see its tokens.", "$text-muted"))
            return
        texts = turn.token_texts or []
        if not texts:
            ids = turn.sampled_ids or []
            texts = [f"⟨{i}⟩" for i in ids]
        if not texts:
            self.update(
                Content.styled("This turn has no sampled tokens (text tier or no reply).", "$text-muted")
            )
            return
        logprobs = turn.logprobs or []
        deltas = token_deltas(self.pair)
        mask = turn.mask or []
        parts: list[tuple[str, str]] = []
        for i, text in enumerate(texts):
            masked = bool(mask) and i < len(mask) and not mask[i]
            if self.drift:
                style = DRIFT_STYLES[drift_tone(deltas[i] if i < len(deltas) else None, masked)]
            else:
                style = TONE_STYLES[logprob_tone(logprobs[i] if i < len(logprobs) else None, masked)]
            if i == self.selected:
                style = f"{style} reverse bold"
            parts.append((token_display(text) or "∅", f"{style} @click=pick({i})".strip()))
        self.update(Content.assemble(*parts))

    def action_pick(self, index: int) -> None:
        """Select token `index` and tell the screen."""
        if self.turn is None:
            return
        count = len(self.turn.token_texts or self.turn.sampled_ids or [])
        if not 0 <= index < count:
            return
        self.selected = index
        self._paint()
        self.post_message(self.Picked(index))

    def action_step(self, delta: int) -> None:
        """Move the selection by `delta` tokens."""
        self.action_pick(0 if self.selected is None else self.selected + delta)
