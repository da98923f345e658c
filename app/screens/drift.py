"""A run's drift (Runs, `d`): the |Δ| of every sampled token its sessions' latest replays scored,
as a text histogram over the Runs screen."""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from tapdeck.app.client import TapdeckClient
from tapdeck.app.screens.rollout import RolloutScreen
from tapdeck.app.views.drift import delta_buckets, deltas_line, histogram_rows, token_deltas

BAR_W = 36
"""Cells of the fullest bucket's bar: its rows (~30 cells besides) fit the modal at 80 columns."""


class RunDriftScreen(ModalScreen[None]):
    """A modal over Runs; Esc, q or d close it."""

    BINDINGS = [Binding("escape,q,d", "dismiss", "Close", id="drift.close")]

    DEFAULT_CSS = """
    RunDriftScreen { align: center middle; }
    RunDriftScreen > Vertical { width: 78; height: auto; max-height: 90%; border: round $primary;
                                background: $surface; padding: 0 1; }
    RunDriftScreen #drift-title { text-style: bold; }
    RunDriftScreen #drift-sessions { color: $text-muted; }
    """

    def __init__(self, client: TapdeckClient, run_id: str, session_ids: list[str]) -> None:
        super().__init__()
        self.client = client
        self.run_id = run_id
        self.session_ids = session_ids
        self.deltas: list[float | None] | None = None
        """Δ of every token of the run's latest replays (None until fetched)."""

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f"run {self.run_id} · |Δ| per sampled token (nats)", id="drift-title")
            yield Static(f"reading the replays of {len(self.session_ids)} session(s)…", id="drift-sessions")
            yield Static("", id="drift-summary")
            yield Static("", id="drift-histogram")
        yield Footer()

    def on_mount(self) -> None:
        self.load_deltas()

    @work(exclusive=True, exit_on_error=False)
    async def load_deltas(self) -> None:
        deltas: list[float | None] = []
        references: set[str] = set()
        replayed = 0
        for session_id in self.session_ids:
            replays = await self.client.replays(session_id)
            if not replays:
                continue
            latest = replays[-1]
            got = await self.client.replay_logprobs(session_id, latest.id)
            replayed += 1
            references.add(f"{latest.model}@{latest.engine}")
            for turn in got.turns:
                deltas.extend(token_deltas(turn))
        self.deltas = deltas
        from tapdeck.app.screen_registry import key_of  # the registry imports this screen

        replay_key = key_of(self.app, "rollout.replay", RolloutScreen)
        against = f" against {', '.join(sorted(references))}" if references else ""
        self.query_one("#drift-sessions", Static).update(
            f"{replayed} of {len(self.session_ids)} session(s) replayed{against}"
            + ("" if replayed else f": {replay_key} on Rollout replays the open session")
        )
        self.query_one("#drift-summary", Static).update(deltas_line(deltas))
        if replayed:
            self.query_one("#drift-histogram", Static).update(
                "\n".join(histogram_rows(delta_buckets(deltas), BAR_W))
            )

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
