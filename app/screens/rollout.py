"""Rollout: the graph of one session's model calls, and each turn's messages and tokens, coloured
by logprob or (after a replay, `p`) by drift against the reference (`c`).

Works while the rollout runs: a `turn_captured` event for this session triggers a refresh that adds
the new nodes to the tree without losing the cursor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from textual import on, work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Input, Sparkline, Static, TabbedContent, TabPane, Tree

from tapdeck.app.client import TapdeckClient
from tapdeck.app.screens.base import TapdeckScreen
from tapdeck.app.server_links import ServerLink
from tapdeck.app.token_series import entropy_series, logprob_series
from tapdeck.app.views.drift import drift_detail, replay_line
from tapdeck.app.views.graph import (
    LiveGraph,
    capture_mode_text,
    policy_span_text,
    policy_text,
    rollout_nodes,
)
from tapdeck.app.views.text import clip, short_id
from tapdeck.app.views.tokens import message_text, token_detail
from tapdeck.app.views.turn_search import find_turns, search_line, turn_texts
from tapdeck.app.widgets.filter_bar import FilterBar, FilterInput
from tapdeck.app.widgets.phrases import Phrases
from tapdeck.app.widgets.rollout_tree import RolloutTree
from tapdeck.app.widgets.token_view import TokenView
from tapdeck.runner.recipes.logprob_mismatch import MEAN
from tapdeck.schema.findings import Finding
from tapdeck.schema.replay import ReplayResult, ReplayTurnLogprobs
from tapdeck.schema.sessions import RolloutStats, TurnDetail

LEVEL_STYLES = {"FATAL": "bold $error", "WARN": "$warning", "INFO": "$text-muted"}
TASK_W = 24
"""Cells the task's name may take in the header (a registry task's can be long)."""


class RolloutScreen(TapdeckScreen):
    """Shows `session_id` of the server `link` (set by `App.open_rollout`)."""

    MODE = "rollout"
    HELP = RolloutTree.HELP

    BINDINGS = [
        Binding("t", "tab('tokens')", "Tokens", id="rollout.tokens"),
        Binding("m", "tab('messages')", "Messages", id="rollout.messages"),
        Binding("f", "tab('findings')", "Findings", id="rollout.findings"),
        Binding("r", "reload", "Reload", id="rollout.reload"),
        # Off the footer, as p: at 80 columns it must keep f1 and q.
        Binding(
            "c",
            "colour",
            "Drift",
            show=False,
            tooltip="Colour tokens by drift / by logprob",
            id="rollout.colour",
        ),
        Binding(
            "p", "replay", "Replay", show=False, tooltip="Replay on the embedded engine", id="rollout.replay"
        ),
        # Screen-level so stepping works whichever pane has focus (the tree usually does).
        Binding("comma", "step_token(-1)", "Prev token", show=False, id="rollout.prev_token"),
        Binding("full_stop", "step_token(1)", "Next token", show=False, id="rollout.next_token"),
        Binding("slash", "search", "Search turns", show=False, id="rollout.search"),
        Binding("n", "next_found(1)", "Next found turn", show=False, id="rollout.search_next"),
        Binding("N", "next_found(-1)", "Previous found turn", show=False, id="rollout.search_prev"),
        Binding("escape", "clear_search", "Clear search", show=False, id="rollout.clear_search"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.session_id: str | None = None
        self.link: ServerLink | None = None
        """The server the shown session is on (its requests go there)."""
        self.graph = LiveGraph()
        self.turn: TurnDetail | None = None
        self.turn_seq: int | None = None
        self.rollout_findings: list[Finding] = []
        """The session's and the whole rollout's findings (sequence checks), as of the last update."""
        self.replay: ReplayResult | None = None
        """The session's latest replay, if any."""
        self.pairs: dict[int, ReplayTurnLogprobs] = {}
        """Its logprobs of each scored turn, by seq."""
        self.replaying = False
        self.search = ""
        self.texts: dict[int, str] = {}
        """Each turn's own text (`turn_texts`), fetched for a search; empty until one."""

    def compose_body(self) -> Iterable[Widget]:
        yield Static("No rollout open: pick a session on Sessions (2) and press Enter.", id="rollout-header")
        yield FilterBar("search turn text (Enter keeps, n / N next / previous, Esc clears)")
        with Horizontal(id="rollout-body"):
            yield RolloutTree(id="graph")
            with Vertical(id="turn-pane"):
                yield Static("", id="turn-header")
                with Horizontal(id="turn-series"):
                    # Textual's Sparkline: one row per series fits 80×24 beside the tree and follows
                    # the theme; a plotext plot would need axes and rows the tokens need more.
                    yield Static("logprob", classes="series-label")
                    yield Sparkline([], id="turn-logprobs")
                    yield Static("entropy", classes="series-label entropy")
                    yield Sparkline([], id="turn-entropy", classes="entropy")
                with TabbedContent(initial="tokens", id="turn-tabs"):
                    with TabPane("Tokens", id="tokens"):
                        with VerticalScroll(id="tokens-scroll"):
                            yield TokenView(id="token-view")
                    with TabPane("Messages", id="messages"):
                        with VerticalScroll(id="messages-scroll"):
                            yield Static("", id="messages-text")
                    with TabPane("Findings", id="findings"):
                        with VerticalScroll():
                            yield Static("", id="findings-text")
                yield Static("", id="token-detail")

    def action_step_token(self, delta: int) -> None:
        """Select the previous/next sampled token of the shown turn."""
        self.query_one(TokenView).action_step(delta)

    @property
    def client(self) -> TapdeckClient:
        """The client of the shown session's server."""
        return self.link.client if self.link is not None else self.app.client

    def shows(self, link: ServerLink) -> bool:
        """A session of `link`'s is shown here."""
        return self.session_id is not None and self.link is link

    def show_session(self, session_id: str, link: ServerLink) -> None:
        """Open another session (clears the view) and load it."""
        if session_id != self.session_id or link is not self.link:
            self.session_id, self.link = session_id, link
            self.graph = LiveGraph()
            self.turn = None
            self.turn_seq = None
            self.rollout_findings = []
            self.replay, self.pairs = None, {}
            self.search, self.texts = "", {}
            if self.is_mounted:
                self.query_one(FilterBar).show("")
                self.query_one(RolloutTree).load({})
                self.query_one(TokenView).drift = False  # another session: its own replay, if any
                self.query_one(TokenView).show(None)
                self.query_one("#token-detail", Static).update("")
                self.query_one("#turn-header", Static).update("")
                # Another session's messages start at their top, not where the last one was read.
                for scroll in self.query("#tokens-scroll, #messages-scroll").results(VerticalScroll):
                    scroll.scroll_home(animate=False)
        self.action_reload()

    def action_reload(self) -> None:
        """Fetch the graph again, from its first turn."""
        if self.session_id and self.is_mounted:
            self.graph = LiveGraph()
            self.load_rollout(self.session_id)

    # -- `/` search over turn text -------------------------------------------------------------
    def action_search(self) -> None:
        """Open the search field; the turns' text is fetched (again, if the rollout grew)."""
        if not self.session_id:
            return
        self.query_one(FilterBar).edit(self.search)
        if len(self.texts) != len(self.graph.turns) or not self.texts:
            self.load_texts(self.session_id)

    @work(exclusive=True, group="turn-texts", exit_on_error=False)
    async def load_texts(self, session_id: str) -> None:
        document = await self.client.rollout(session_id)
        if session_id == self.session_id:
            self.texts = turn_texts(document.turns)
            self._show_found(jump=True)

    @on(Input.Changed, "FilterBar FilterInput")
    def _search_typed(self, event: Input.Changed) -> None:
        if event.value != self.search:
            self.search = event.value
            self._show_found(jump=True)

    @on(Input.Submitted, "FilterBar FilterInput")
    def _search_kept(self) -> None:
        self.query_one(FilterBar).done()
        self.query_one(RolloutTree).focus()

    @on(FilterInput.Cleared)
    def _search_cleared(self) -> None:
        self.action_clear_search()

    def action_clear_search(self) -> None:
        self.search = ""
        self.query_one(FilterBar).done()
        self._show_found()
        self.query_one(RolloutTree).focus()

    def action_next_found(self, step: int) -> None:
        """The next (or previous) turn the search found, round the end."""
        found = find_turns(self.texts, self.search)
        if found:
            at = found.index(self.turn_seq) + step if self.turn_seq in found else (0 if step > 0 else -1)
            self._go_to(found[at % len(found)])

    def _show_found(self, jump: bool = False) -> None:
        """Say what the search finds; with `jump`, show its first turn (unless one is shown)."""
        found = find_turns(self.texts, self.search)
        if jump and found and self.turn_seq not in found:
            self._go_to(found[0])
            return
        self.query_one(FilterBar).show(search_line(self.search, found, self.turn_seq))

    def _go_to(self, seq: int) -> None:
        self.query_one(RolloutTree).select_seq(seq)
        self.turn_seq = seq
        self.query_one(FilterBar).show(search_line(self.search, find_turns(self.texts, self.search), seq))
        if self.session_id:
            self.load_turn(self.session_id, seq)

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    @on(TabbedContent.TabActivated, "#turn-tabs")
    def _tab_shown(self, event: TabbedContent.TabActivated) -> None:
        # The picked token's line belongs to the Tokens tab; under the others it read as theirs.
        self.query_one("#token-detail", Static).display = event.pane.id == "tokens"

    def turn_captured(self, session_id: str, server: str) -> None:
        """Called by the App for each (coalesced) turn_captured event of the server named `server`:
        only the new turns' headers (and every turn's parent and role) are fetched, never the
        tokens of turns not shown."""
        if session_id == self.session_id and self.link and server == self.link.name and self.is_mounted:
            self.load_rollout(session_id)

    @work(exclusive=True, group="rollout", exit_on_error=False)
    async def load_rollout(self, session_id: str) -> None:
        view = await self.client.graph(session_id, since=self.graph.next_since())
        if session_id != self.session_id:
            return
        # The tree first, and the first turn asked for: the rest comes from slower requests (a
        # long rollout's checks take the server a while).
        self.apply_graph(self.graph.apply(view))
        if self.turn_seq is None and self.graph.turns:
            first = min(self.graph.turns)
            self.query_one(RolloutTree).select_seq(first)
            self.load_turn(session_id, first)
        # The whole-rollout checks (roots, discards, each sequence's) are built over every turn, so
        # the server reports them with the session, not on the incremental view: fetched per update.
        detail, replays = await asyncio.gather(
            self.client.session(session_id), self.client.replays(session_id)
        )
        if session_id != self.session_id:
            return
        self.rollout_findings = [f for f in detail.findings if f.turn is None]
        if replays and (self.replay is None or replays[-1].id != self.replay.id):
            await self._take_replay(session_id, replays[-1])
        self.apply_graph(tree_changed=False)

    def apply_graph(self, tree_changed: bool = True) -> None:
        """Header, tree and findings from the screen's live copy of the graph."""
        stats = self.graph.stats or RolloutStats()
        board = self.link.board if self.link is not None else self.app.board
        summary = board.get(self.session_id or "")
        task = summary.metadata.get("task") if summary is not None else None
        # Terse, so that all of it fits the header's lines at 80 columns; each phrase kept whole.
        parts = [f"session {short_id(self.session_id)}"]
        if self.link is not None and self.app.links.several:
            parts.append(f"on {self.link.name}")
        if task:
            parts.append(clip(str(task), TASK_W))
        parts.append(f"tier {self.graph.tier}")
        modes = [t.token_in for t in self.graph.turns.values()]
        if any(modes):
            parts.append(f"token-in {modes.count('ids')}/{len(modes)}")
        for key in ("turns", "roots", "forks", "breaks", "discarded"):
            parts.append(f"{key} {getattr(stats, key)}")
        parts.append(f"trainable {stats.trainable_tokens} tok")
        parts.append(f"frag. {stats.fragmentation:.2f}")
        if span := policy_span_text(summary.policy if summary is not None else None):
            parts.append(span)
        if self.replaying:
            parts.append("replaying…")
        elif self.replay is not None and self.replay.session is not None:
            parts.append(f"drift |Δ| {self.replay.session.metrics.get(MEAN, float('nan')):.3f}")
        self.query_one("#rollout-header", Static).update(Phrases(parts))
        if tree_changed:
            self.query_one(RolloutTree).load(rollout_nodes(self.graph.turns.values()))
        self._show_findings()

    def _show_findings(self) -> None:
        lines: list[tuple[str, str]] = []
        rollout_findings = self.rollout_findings + [
            f for f in self.graph.findings if f not in self.rollout_findings
        ]
        if rollout_findings:
            lines.append(("Rollout\n", "bold"))
            lines.extend((f"{f}\n", LEVEL_STYLES[f.level]) for f in rollout_findings)
        if self.turn is not None:
            turn_findings = self.turn.findings
            lines.append((f"Turn #{self.turn.seq}\n", "bold"))
            lines.extend((f"{f}\n", LEVEL_STYLES[f.level]) for f in turn_findings)
            if not turn_findings:
                lines.append(("no findings\n", "$text-muted"))
        if not lines:
            lines.append(("No findings.", "$text-muted"))
        self.query_one("#findings-text", Static).update(Content.assemble(*lines))

    @on(Tree.NodeSelected, "#graph")
    def _node_selected(self, event: Tree.NodeSelected) -> None:
        if event.node.data is not None and self.session_id:
            self.load_turn(self.session_id, int(event.node.data))

    @work(exclusive=True, group="turn", exit_on_error=False)
    async def load_turn(self, session_id: str, seq: int) -> None:
        turn = await self.client.turn(session_id, seq)
        if session_id != self.session_id:
            return
        self.show_turn(turn)

    def show_turn(self, turn: TurnDetail) -> None:
        """Messages, tokens and findings of one turn."""
        again = self.turn is not None and self.turn.seq == turn.seq
        self.turn = turn
        self.turn_seq = turn.seq
        sampled = turn.sampled_ids or turn.token_texts or []
        header = [
            f"turn #{turn.seq}",
            "root" if turn.parent is None else f"{turn.link_kind} link to #{turn.parent}",
            f"prompt {'?' if turn.prompt_len is None else turn.prompt_len} tok",
            f"sampled {len(sampled)}",
            f"finish {turn.finish_reason or '?'}",
            capture_mode_text(turn.meta),
        ]
        if policy := policy_text(turn.policy_version, turn.policy_version_straddled):
            straddled = " (straddled an update)" if turn.policy_version_straddled else ""
            header.append(f"policy {policy}{straddled}")
        self.query_one("#turn-header", Static).update(Phrases(header))
        self.query_one("#turn-logprobs", Sparkline).data = logprob_series(turn)
        entropy = entropy_series(turn)
        self.query_one("#turn-entropy", Sparkline).data = entropy
        for widget in self.query("#turn-series .entropy"):
            widget.display = bool(entropy)  # no alternatives captured: no entropy to draw
        view = self.query_one(TokenView)
        view.show(turn, keep_selection=again, pair=self.pairs.get(turn.seq))
        if view.selected is None:
            self.query_one("#token-detail", Static).update(
                Content.styled("Click a token (or , .) for its logprob and alternatives.", "$text-muted")
            )
        request = turn.request or {}
        parts: list[tuple[str, str]] = []
        for message in request.get("messages") or []:
            parts.append(
                (
                    message_text(message)[:4000] + "\n\n",
                    "bold $secondary" if message.get("role") == "system" else "",
                )
            )
        response = turn.response or {}
        if response:
            parts.append(("⇒ " + message_text(response)[:4000], "bold $accent"))
        self.query_one("#messages-text", Static).update(
            Content.assemble(*parts) if parts else Content("(no messages recorded)")
        )
        self._show_findings()
        if self.search:  # which of the found turns this is, however it was reached
            self.query_one(FilterBar).show(
                search_line(self.search, find_turns(self.texts, self.search), turn.seq)
            )

    @on(TokenView.Picked)
    def _token_picked(self, event: TokenView.Picked) -> None:
        if self.turn is not None:
            # After a replay, both logprobs (the sampler's and the reference's) in the logprob's place.
            both = drift_detail(self.pairs.get(self.turn.seq), event.index) if self.replay else None
            self.query_one("#token-detail", Static).update(
                Content(token_detail(self.turn, event.index, both))
            )

    # -- drift against a replay --------------------------------------------------------------------
    async def _take_replay(self, session_id: str, replay: ReplayResult) -> None:
        """Fetch a replay's per-token logprobs and show them (the open turn recoloured)."""
        got = await self.client.replay_logprobs(session_id, replay.id)
        if session_id != self.session_id:
            return
        self.replay, self.pairs = replay, {t.seq: t for t in got.turns}
        if self.turn is not None:
            self.query_one(TokenView).show(self.turn, keep_selection=True, pair=self.pairs.get(self.turn.seq))

    def action_colour(self) -> None:
        """Colour the tokens by drift against the latest replay, or by logprob again."""
        from tapdeck.app.screen_registry import key_of  # the registry imports this screen

        view = self.query_one(TokenView)
        if not view.drift and self.replay is None:
            self.app.notify(
                f"No replay of this session yet: {key_of(self.app, 'rollout.replay', self)} replays it "
                "against the server's embedded engine (or run `tapdeck replay`).",
                severity="warning",
            )
            return
        view.colour_by(not view.drift)

    def action_replay(self) -> None:
        """Replay the open session against the server's embedded engine, then colour by drift."""
        if not self.session_id:
            self.app.notify("No rollout open: nothing to replay.", severity="warning")
            return
        if self.replaying:
            self.app.notify("A replay of this session is running.", severity="warning")
            return
        self.replaying = True
        self.apply_graph(tree_changed=False)
        self.app.notify(f"Replaying session {short_id(self.session_id)} on the embedded engine…")
        self.run_replay(self.session_id)

    @work(group="replay", exit_on_error=False)
    async def run_replay(self, session_id: str) -> None:
        try:
            replay = await self.client.replay(session_id)
            await self._take_replay(session_id, replay)
        finally:
            if session_id == self.session_id:
                self.replaying = False
                self.apply_graph(tree_changed=False)
        if session_id == self.session_id:
            self.query_one(TokenView).colour_by(True)
        self.app.notify(
            f"session {short_id(session_id)}: {replay_line(replay)}", title="Replay done", timeout=10
        )
