"""Sessions: the live table of capture sessions, refreshed by diff from the event stream, and the
stuck-rollout pane for the highlighted session (`d`), from which one rollout can be cancelled (`x`).

Attached to several servers, the table holds every server's rows (keys `NAME/ID`, a server column)
and each action goes to the highlighted row's server."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable

from textual import on
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widget import Widget
from textual.widgets import DataTable, Sparkline, Static

from tapdeck.app.client import ApiError
from tapdeck.app.confirm import CONFIRM_S, TwoPress
from tapdeck.app.screens.row_view_keys import FILTER_PLACEHOLDER, RowViewKeys, row_view_bindings
from tapdeck.app.screens.sandbox import SandboxScreen
from tapdeck.app.server_links import ServerLink
from tapdeck.app.stuck_view import PaneLine, calls_per_second, pane_lines
from tapdeck.app.views.drift import replay_line
from tapdeck.app.views.errors import describe_error
from tapdeck.app.views.row_view import arrange, view_line
from tapdeck.app.views.sessions import ENDED_STATES, rollout_state, session_state
from tapdeck.app.widgets.activity_pane import ActivityPane
from tapdeck.app.widgets.filter_bar import FilterBar
from tapdeck.app.widgets.session_table import SessionTable
from tapdeck.schema.activity import SessionActivity
from tapdeck.schema.findings import Finding
from tapdeck.schema.replay import ReplayResult

REFRESH_HZ = 4
ACTIVITY_POLL_S = 1.0
RATE_BUCKETS, RATE_BUCKET_S = 40, 3.0
"""The calls/s lines (the board's, the pane's): the last two minutes in 3 s steps."""


class SessionsScreen(RowViewKeys):
    """Reads the App's `SessionBoard`; repaints at most REFRESH_HZ times a second, only changed cells."""

    MODE = "sessions"
    HELP = SessionTable.HELP

    # Priority: the table's own (hidden) Enter would otherwise hide this one from the footer.
    BINDINGS = [
        Binding("enter", "open", "Open rollout", id="sessions.open", show=True, priority=True),
        Binding("d", "details", "Details", id="sessions.details", show=True),
        Binding("x", "cancel_rollout", "Cancel rollout", id="sessions.cancel", show=True),
        Binding("l", "inside", "Inside the sandbox", id="sessions.inside", show=False),
        *row_view_bindings("sessions"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._seen_version: tuple[tuple[int, bool], ...] = ()
        self._seen_second = -1
        self.activity: SessionActivity | None = None
        self.activity_error = ""
        self.findings: list[Finding] = []
        self.replay: ReplayResult | None = None
        """The pane's session's latest replay (its drift line), if any."""
        self._fetched_at = 0.0
        self._cancel = TwoPress()

    def compose_body(self) -> Iterable[Widget]:
        yield Static("", id="sessions-summary")
        yield FilterBar(FILTER_PLACEHOLDER)
        with Horizontal(id="board-rate-row"):
            yield Static("all calls/s", id="board-rate-label")
            # Textual's Sparkline, as in the pane: one row above the table, in the theme's colours.
            yield Sparkline([], id="board-rate")
            yield Static("", id="board-rate-span")
        yield SessionTable(id="sessions", with_server=self.app.links.several)
        yield ActivityPane(id="activity")

    def on_mount(self) -> None:
        self.refresh_table()
        self.set_interval(1 / REFRESH_HZ, self.refresh_table, name="sessions-refresh")
        self.set_interval(ACTIVITY_POLL_S, self._poll_activity, name="activity-poll")

    def on_screen_resume(self) -> None:
        self.refresh_table(force=True)

    def on_resize(self) -> None:
        self.refresh_table(force=True)  # the summary says which columns a narrow width hides

    def refresh_table(self, force: bool = False) -> None:
        """Apply the boards to the table if one changed or a server stopped or started answering
        (or a second passed: idle counters move). Not while another screen is shown: the table is
        laid out again when this one comes back (`on_screen_resume`)."""
        if not self.is_current:
            return
        links = self.app.links
        now = self.app.clock()
        second = int(now)
        version = tuple((link.board.version, bool(link.lost)) for link in links)
        if not force and version == self._seen_version and second == self._seen_second:
            return
        self._seen_version, self._seen_second = version, second
        rows = links.session_rows(now)
        if self.view.arranges:
            facts = links.session_facts(now)
            kept = arrange((facts[key] for key in rows), self.view)
        else:
            kept = list(rows)
        self.query_one(SessionTable).apply({key: rows[key] for key in kept})
        self.query_one(FilterBar).show(view_line(self.view, len(kept), len(rows)))
        states = Counter(links.states())
        total = sum(states.values())
        by_state = " · ".join(f"{n} {s}" for s, n in sorted(states.items()))
        # Several servers: the counts are every server's, summed (the server column tells them apart).
        servers = f" on {len(links)} servers" if links.several else ""
        summary = (
            f"{total} session{'s' if total != 1 else ''}{servers} · {by_state}"
            if total
            else "No capture sessions yet: start a batch on Setup (1)."
        )
        hidden, shown_at = self.query_one(SessionTable).hidden()
        if hidden:
            summary += f" · {'/'.join(hidden)} hidden (under {shown_at} columns)"
        self._say("#sessions-summary", summary)
        self._show_board_rate(now)
        self._show_pane()

    def _show_board_rate(self, now: float) -> None:
        """Every session's captured calls per second, the last two minutes, as this TUI saw them."""
        rates = calls_per_second(list(self.app.links.call_times()), now, RATE_BUCKETS, RATE_BUCKET_S)
        self.query_one("#board-rate", Sparkline).data = rates
        self._say(
            "#board-rate-span",
            f"last {int(RATE_BUCKETS * RATE_BUCKET_S)} s · now {rates[-1]:.1f} · peak {max(rates):.1f}",
        )

    def _say(self, selector: str, text: str) -> None:
        """Put `text` in a line of the screen's unless it is there: each update lays the whole screen
        out again, and the table is refreshed 4 times a second."""
        line = self.query_one(selector, Static)
        if line.content != text:
            line.update(text)

    def view_changed(self) -> None:
        self.refresh_table(force=True)

    def focus_table(self) -> None:
        self.query_one(SessionTable).focus()

    def highlighted(self) -> str | None:
        """The key of the highlighted row (a session id, or a rollout id without a session; each
        after its server's name with several servers)."""
        table = self.query_one(SessionTable)
        if table.row_count == 0:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def _row(self, key: str | None) -> tuple[ServerLink, str] | None:
        """The server and the id (a session's, or a sessionless rollout's) of the row `key`."""
        return self.app.links.find(key)

    def action_open(self) -> None:
        """Open the highlighted session on the Rollout screen."""
        key = self.highlighted()
        if key:
            self._open(key)

    def _open(self, key: str) -> None:
        row = self._row(key)
        if row is not None and row[1] in row[0].board.entries:
            self.app.open_rollout(row[1], row[0])
        else:
            self.app.notify(
                "This rollout has no capture session (its harness makes no model calls).", severity="warning"
            )

    @on(DataTable.RowSelected, "#sessions")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self._open(event.row_key.value)

    # -- the stuck-rollout pane ------------------------------------------------------------------
    def action_details(self) -> None:
        """Show or hide the pane for the highlighted session."""
        pane = self.query_one(ActivityPane)
        pane.toggle_class("shown")
        if pane.has_class("shown"):
            self._poll_activity()

    @on(DataTable.RowHighlighted, "#sessions")
    def _row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self._cancel.disarm()
        if self.query_one(ActivityPane).has_class("shown"):
            self.activity, self.findings, self.activity_error = None, [], ""
            self._poll_activity()

    def _poll_activity(self) -> None:
        key = self.highlighted()
        row = self._row(key)
        if (
            not self.query_one(ActivityPane).has_class("shown")
            or key is None
            or row is None
            or row[1] not in row[0].board.entries
        ):
            self._show_pane()
            return
        self.run_worker(
            self._fetch_activity(key, *row), group="activity", exclusive=True, exit_on_error=False
        )

    async def _fetch_activity(self, key: str, link: ServerLink, session_id: str) -> None:
        try:
            activity = await link.client.activity(session_id)
            findings = (await link.client.session(session_id)).findings
            replays = await link.client.replays(session_id)
        except ApiError as exc:
            self.activity_error = describe_error(exc)  # said in the pane, not a notification a second
        else:
            if self.highlighted() != key:
                return
            self.activity, self.findings, self.activity_error = activity, list(findings), ""
            self.replay = replays[-1] if replays else None
            self._fetched_at = self.app.clock()
        self._show_pane()

    def _server_now(self) -> float:
        if self.activity is None:
            return time.time()
        return self.activity.now + max(0.0, self.app.clock() - self._fetched_at)

    def _show_pane(self) -> None:
        pane = self.query_one(ActivityPane)
        if not pane.has_class("shown"):
            return
        row = self._row(self.highlighted())
        if row is None:
            pane.show([PaneLine("session", "none: the table is empty", "muted")], [], "")
            return
        link, key = row
        activity = self.activity if self.activity and self.activity.session_id == key else None
        lines = pane_lines(
            link.board.get(key),
            link.board.rollout_of(key),
            activity,
            self.findings if activity else [],
            self._server_now(),
        )
        if activity and self.replay is not None and self.replay.session_id == key:
            # Beside the calls, above the texts that fill the pane: in view at 80×24.
            at = next((i + 1 for i, line in enumerate(lines) if line.label == "calls"), len(lines))
            lines.insert(at, PaneLine("drift", replay_line(self.replay)))
        if self.activity_error:
            lines.append(PaneLine("error", self.activity_error, "error"))
        rates = (
            calls_per_second(activity.recent_ends, self._server_now(), RATE_BUCKETS, RATE_BUCKET_S)
            if activity
            else []
        )
        pane.show(
            lines, rates, f"last {int(RATE_BUCKETS * RATE_BUCKET_S)} s · peak {max(rates, default=0):.1f}"
        )

    def action_cancel_rollout(self) -> None:
        """Cancel the highlighted rollout: the first press asks, a second one within CONFIRM_S
        cancels."""
        row = self._row(self.highlighted())
        if row is None:
            self.app.notify("No session highlighted: nothing to cancel.", severity="warning")
            return
        link, key = row
        rollout = link.board.rollout_of(key)
        summary = link.board.get(key)
        meta = summary.metadata if summary is not None else {}
        run_id = (rollout.run_id if rollout else None) or meta.get("run_id")
        rollout_id = (rollout.rollout_id if rollout else None) or meta.get("rollout_id")
        if not run_id or not rollout_id:
            self.app.notify("This session is not a rollout of a run: nothing to cancel.", severity="warning")
            return
        if summary is not None:
            state = session_state(summary)
        else:
            assert rollout is not None  # with neither there is no run id: returned above
            state = rollout_state(rollout)
        if state in ENDED_STATES:
            self._cancel.disarm()
            self.app.notify(f"rollout {rollout_id} already {state}: nothing to cancel.", severity="warning")
            return
        where = f" on {link.name}" if self.app.links.several else ""
        if not self._cancel.press(self.app.links.key(link, rollout_id), self.app.clock()):
            from tapdeck.app.screen_registry import key_of  # the registry imports this screen

            self.app.notify(
                f"Press {key_of(self.app, 'sessions.cancel', self)} again within "
                f"{CONFIRM_S:g} s to cancel rollout {rollout_id}{where}.",
                title="Cancel rollout?",
                timeout=CONFIRM_S,
            )
            return
        self.run_worker(
            self._cancel_rollout(link, run_id, rollout_id, where), group="cancel-rollout", exit_on_error=False
        )

    def action_inside(self) -> None:
        """Open the highlighted rollout's sandbox: its processes and its agent's own output."""
        row = self._row(self.highlighted())
        link, key = row if row is not None else (self.app.links.first, "")
        rollout = link.board.rollout_of(key) if row is not None else None
        summary = link.board.get(key) if row is not None else None
        meta = summary.metadata if summary is not None else {}
        run_id = (rollout.run_id if rollout else None) or meta.get("run_id")
        rollout_id = (rollout.rollout_id if rollout else None) or meta.get("rollout_id")
        if not run_id or not rollout_id:
            self.app.notify("This session is not a rollout of a run: it has no sandbox.", severity="warning")
            return
        self.app.push_screen(SandboxScreen(link.client, run_id, rollout_id))

    async def _cancel_rollout(self, link: ServerLink, run_id: str, rollout_id: str, where: str) -> None:
        await link.client.cancel_rollout(run_id, rollout_id)
        self.app.notify(f"Cancelling rollout {rollout_id}{where}: its sandbox is being torn down.")
