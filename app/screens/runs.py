"""Runs: batches with per-task groups, rewards, pass rates and failures by cause; export a run.

Attached to several servers, the runs table holds every server's runs (keys `NAME/ID`, a server
column, a server that stopped answering greyed with its runs as last listed) and each action goes to
the shown run's server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from rich.text import Text
from textual import on, work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import DataTable, Static

from tapdeck.app.client import ApiError
from tapdeck.app.confirm import CONFIRM_S, TwoPress
from tapdeck.app.histogram import bars, histogram, reward_line
from tapdeck.app.screens.drift import RunDriftScreen
from tapdeck.app.screens.row_view_keys import FILTER_PLACEHOLDER, RowViewKeys, row_view_bindings
from tapdeck.app.screens.sandbox import SandboxScreen
from tapdeck.app.server_links import SERVER_W, ServerLink
from tapdeck.app.table_rows import cursor_key, show_rows
from tapdeck.app.views.row_view import arrange, rollout_facts, view_line
from tapdeck.app.views.runs import (
    degenerate_phrase,
    failures_line,
    fmt_rate,
    rollout_settings_line,
    run_engine,
    run_groups,
    run_outcomes,
)
from tapdeck.app.views.sessions import fmt_phase
from tapdeck.app.views.text import clip, fmt_reward, id_tail
from tapdeck.app.widgets.filter_bar import FilterBar
from tapdeck.schema.runs import RolloutResult, RunDetail, RunSummary, runs_again_on_resume
from tapdeck.schema.sessions import EngineVersions, staleness

CANCEL_WAIT_S = 300.0
"""How long the Runs screen follows a cancelled run to its end (its sandboxes' teardown)."""
RUN_ID_MIN_W = 10
OTHER_RUN_COLUMNS_W = 56
"""The runs table's columns but the id, with their padding and the scrollbar: the id gets the rest."""
SERVER_COLUMN_W = SERVER_W + 2
"""The server column with its padding (attached to several servers)."""

GROUP_BINS = 5
"""A group's reward histogram: five bins over 0-1 (K is small; ten would be mostly empty)."""


class RunsScreen(RowViewKeys):
    """Top: all runs. Below: the highlighted run's groups, failures and rollouts."""

    MODE = "runs"
    # Under 120 columns the groups and the rollouts stack: side by side, neither table fits.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    HELP = (
        "Batches started from Setup (or the CLI). Enter shows a run's groups; o opens the "
        "highlighted rollout; e / p export the run as JSONL / Parquet on the server's machine; "
        "x twice within 5 s cancels the run; u resumes a stopped run (its cancelled and never-run "
        "rollouts run again). fail / canc: rollouts that failed / were cancelled (a cancel is not "
        "a failure). stale: policy versions the engine moved on since the rollout's oldest turn "
        "was sampled. Under the groups: the run's failures by cause, and its rollouts graded "
        "degenerate (one call, or too little of it trainable), which trainers skip. d shows "
        "the run's drift: the |Δ| histogram of its sessions' latest replays."
    )

    # Short words and Parquet off the footer: at 80 columns it must keep r, f1 and q too.
    BINDINGS = [
        Binding("e", "export('jsonl')", "Export", tooltip="Export the run as JSONL", id="runs.export_jsonl"),
        Binding("p", "export('parquet')", "Parquet", show=False, id="runs.export_parquet"),
        Binding("x", "cancel", "Cancel", tooltip="Cancel the run (asks first)", id="runs.cancel"),
        Binding("u", "resume", "Resume", id="runs.resume"),
        Binding("o", "open_rollout", "Open", tooltip="Open the highlighted rollout", id="runs.open"),
        Binding("l", "inside", "Inside", show=False, tooltip="The rollout's sandbox", id="runs.inside"),
        Binding("r", "reload", "Reload", id="runs.reload"),
        Binding("d", "drift", "Drift", show=False, tooltip="The run's |Δ| histogram", id="runs.drift"),
        *row_view_bindings("runs"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[RunSummary] = []
        """Every server's runs, newest first."""
        self.listed: dict[str, tuple[ServerLink, RunSummary]] = {}
        """Each row of the runs table by its key: the run and its server."""
        self._last_listed: dict[str, list[RunSummary]] = {}
        """Each server's runs as it last listed them (kept, greyed, while it does not answer)."""
        self.run_key: str | None = None
        """The key of the shown run (its id; after its server's name with several servers)."""
        self.link: ServerLink | None = None
        """The shown run's server."""
        self.detail: RunDetail | None = None
        self.versions: dict[str, EngineVersions] = {}
        """Each server's engines' current policy versions (the staleness column's "now")."""
        self._cancel = TwoPress()

    @property
    def run_id(self) -> str | None:
        """The shown run's id on its server."""
        found = self.app.links.find(self.run_key)
        return found[1] if found is not None else None

    def compose_body(self) -> Iterable[Widget]:
        runs: DataTable[str] = DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        if self.app.links.several:
            runs.add_column("server", key="server")
        # Short headers, as the Sessions table's: with the cancelled apart, whole run ids still fit 80.
        for label, key in (
            ("run", "run"),
            ("state", "state"),
            ("done", "done"),
            ("ok", "ok"),
            ("fail", "failed"),
            ("canc", "cancelled"),
            ("reward", "reward"),
            ("pass", "pass"),
        ):
            runs.add_column(label, key=key)
        yield runs
        yield Static("", id="run-header")
        yield Static("", id="run-settings")
        yield FilterBar(FILTER_PLACEHOLDER)  # the rollouts table's filter and sort
        with Horizontal(id="run-detail"):
            with Vertical(id="groups-pane"):
                groups: DataTable[str] = DataTable(id="groups-table", cursor_type="row")
                groups.add_columns("task", "done", "rewards", "mean", "pass", "hist")
                yield groups
                yield Static("", id="failures")
            rollouts: DataTable[str] = DataTable(id="rollouts-table", cursor_type="row")
            # "calls", as the CLI's table says: a turn limit counts the agent's turns, not these.
            for label, key in (
                ("task", "task"),
                ("#", "#"),
                ("phase", "phase"),
                ("reward", "reward"),
                ("calls", "turns"),
                ("stale", "stale"),
                ("error", "error"),
            ):
                rollouts.add_column(label, key=key)
            yield rollouts

    def on_mount(self) -> None:
        self.action_reload()

    def on_screen_resume(self) -> None:
        self.action_reload()

    def action_reload(self) -> None:
        """Fetch the runs and the shown run."""
        self.load_runs()

    def runs_changed(self) -> None:
        """Called by the App on (coalesced) run events."""
        if self.is_mounted:
            self.load_runs()

    @work(exclusive=True, group="runs", exit_on_error=False)
    async def load_runs(self) -> None:
        links = self.app.links
        if links.several:
            # Each server asked at once; one that does not answer keeps its runs as last listed.
            answers = await asyncio.gather(*(self._runs_of(link) for link in links))
            for link, got in zip(links, answers, strict=True):
                if got is not None:
                    self._last_listed[link.name], self.versions[link.name] = got
        else:
            link = links.first
            self._last_listed[link.name] = await link.client.runs()
            self.versions[link.name] = await link.client.engine_versions()
        listed = [
            (links.key(link, run.id), (link, run))
            for link in links
            for run in self._last_listed.get(link.name, [])
        ]
        self.listed = dict(sorted(listed, key=lambda item: item[1][1].created_at, reverse=True))
        self.runs = [run for _, run in self.listed.values()]
        self._fill_runs_table()
        if not self.runs:
            self.query_one("#run-header", Static).update("No runs yet: start a batch on Setup (1).")
            return
        # The run under the cursor: the one shown so far, or the nearest row once it is gone.
        key = self.run_key = cursor_key(self.query_one("#runs-table", DataTable))
        if key is None or key not in self.listed:  # not while the table holds `self.runs`
            return
        link, run = self.listed[key]
        if link.lost:
            return  # its detail stays as last read: the status line says its server is gone
        detail = await link.client.run(run.id)
        if key == self.run_key:  # else another run was highlighted meanwhile
            self.show_detail(detail, link)

    async def _runs_of(self, link: ServerLink) -> tuple[list[RunSummary], EngineVersions] | None:
        """A server's runs and engine versions; None when it does not answer (its status line and
        greyed rows say so)."""
        try:
            return await link.client.runs(), await link.client.engine_versions()
        except ApiError as exc:
            if exc.kind != "unreachable":
                raise
            return None

    def _fill_runs_table(self) -> None:
        several = self.app.links.several
        id_width = max(
            RUN_ID_MIN_W, self.size.width - OTHER_RUN_COLUMNS_W - (SERVER_COLUMN_W if several else 0)
        )
        rows: dict[str, tuple[str | Text, ...]] = {}
        for key, (link, run) in self.listed.items():
            cells = (
                *((clip(link.name, SERVER_W),) if several else ()),
                id_tail(run.id, id_width),
                run.state,
                f"{run.counts.done}/{run.counts.total}",
                str(run.counts.ok),
                *map(str, run_outcomes(run)),
                fmt_reward(run.mean_reward),
                fmt_rate(run.pass_rate),
            )
            # A server that stopped answering: its runs as it last listed them, greyed.
            rows[key] = tuple(Text(cell, style="dim") for cell in cells) if link.lost else cells
        with self.app.batch_update():
            show_rows(self.query_one("#runs-table", DataTable), rows)

    def on_resize(self) -> None:
        # The id column takes what the other columns leave, so it is cut again at a new width.
        if self.runs:
            self._fill_runs_table()

    @on(DataTable.RowHighlighted, "#runs-table")
    def _run_highlighted(self) -> None:
        # The cursor's run now, not the event's: laying the rows out again highlights the first
        # row on the way to the kept one.
        key = cursor_key(self.query_one("#runs-table", DataTable))
        if key and key != self.run_key and key in self.listed:
            self.run_key = key
            self.load_detail(key)

    @work(exclusive=True, group="run-detail", exit_on_error=False)
    async def load_detail(self, key: str) -> None:
        link, run = self.listed[key]
        detail = await link.client.run(run.id)
        if key == self.run_key:  # else another run was highlighted meanwhile
            self.show_detail(detail, link)

    def show_detail(self, detail: RunDetail, link: ServerLink) -> None:
        """Groups, failures and rollouts of one run (on `link`); the highlighted group and rollout
        stay highlighted while the same run is shown again (a run event, coming back to the screen)."""
        groups = self.query_one("#groups-table", DataTable)
        table = self.query_one("#rollouts-table", DataTable)
        another_run = self.detail is None or self.detail.id != detail.id or self.link is not link
        self.detail, self.link = detail, link
        plan = detail.plan
        where = f" on {link.name}" if self.app.links.several else ""
        before = (
            f"run {detail.id}{where} · {plan.dataset or 'sample'} · {plan.rollout.harness} · "
            f"{plan.rollout.sandbox} · "
        )
        after = f" · K={plan.k}"
        # The engine takes the line's room left (the header's padding is 2 cells), never under 16.
        room = max(16, self.size.width - 2 - len(before) - len(after))
        self.query_one("#run-header", Static).update(before + run_engine(detail, room) + after)
        rollouts = detail.rollouts
        going = detail.state == "running"
        by_id = {r.rollout_id: r for r in rollouts}
        ordered = sorted(rollouts, key=lambda r: (r.task, r.index))
        server = link.name if self.app.links.several else ""
        kept = arrange(
            (rollout_facts(r, link.board, now=self.app.clock(), server=server) for r in ordered), self.view
        )
        self.query_one(FilterBar).show(view_line(self.view, len(kept), len(rollouts)))
        with self.app.batch_update():
            if another_run:  # its rows from the top, not from the last run's place
                groups.clear()
                table.clear()
            show_rows(
                groups,
                {
                    group.task: (
                        clip(group.task, 28),
                        f"{group.done}/{group.total}",
                        " ".join(fmt_reward(r) for r in group.rewards)[:24],
                        fmt_reward(group.mean),
                        fmt_rate(group.pass_rate),
                        bars(histogram(group.rewards, GROUP_BINS)),
                    )
                    for group in run_groups(rollouts)
                },
            )
            show_rows(
                table,
                {
                    r.rollout_id: (
                        clip(r.task, 24),
                        str(r.index),
                        fmt_phase(r, run_going=going),
                        fmt_reward(r.reward),
                        str(self._turns(r)),
                        self._staleness(r),
                        r.error_kind or "",
                    )
                    for r in (by_id[key] for key in kept)
                },
            )
        self._show_settings(self._selected_rollout())
        # The server's own counts (as the runs table's fail and canc), not recounted from the
        # rollouts: after a resume a rollout running again still carries its old failure.
        self.query_one("#failures", Static).update(
            f"rewards {reward_line(r.reward for r in rollouts)}\n"
            f"{failures_line(detail.failures, len(detail.left_out))}"
            f"{degenerate_phrase(detail.counts.degenerate, ' · ')}"
        )

    def view_changed(self) -> None:
        if self.detail is not None and self.link is not None:
            self.show_detail(self.detail, self.link)

    def focus_table(self) -> None:
        self.query_one("#rollouts-table", DataTable).focus()

    def _turns(self, rollout: RolloutResult) -> int:
        """A rollout's captured turns: live from the App's session board (what Sessions shows),
        as the run's own result counts them only when the rollout ends."""
        board = self.link.board if self.link is not None else None
        summary = board.get(rollout.session_id) if board is not None and rollout.session_id else None
        return max(rollout.turns, summary.turns) if summary is not None else rollout.turns

    def _staleness(self, rollout: RolloutResult) -> str:
        """Policy versions since the rollout's oldest turn was sampled: its engine's current
        version minus that turn's ("–": unknown, or versions that are not step numbers)."""
        link = self.link
        summary = link.board.get(rollout.session_id) if link is not None and rollout.session_id else None
        if link is None or summary is None or summary.policy is None:
            return "–"
        versions = self.versions.get(link.name, EngineVersions(engines=[]))
        lag = staleness(versions.current(summary.engine.url), summary.policy.oldest)
        return "–" if lag is None else str(lag)

    def sessions_changed(self) -> None:
        """Called by the App on (coalesced) session events: the turns column follows them."""
        # None once Textual tears the screen down at exit, while server events still arrive.
        table = next(self.query("#rollouts-table").results(DataTable), None)
        if self.detail is None or table is None:
            return
        for rollout in self.detail.rollouts:
            if rollout.rollout_id in table.rows:
                table.update_cell(rollout.rollout_id, "turns", str(self._turns(rollout)))
                table.update_cell(rollout.rollout_id, "stale", self._staleness(rollout))

    def _show_settings(self, rollout: RolloutResult | None) -> None:
        """What the highlighted rollout ran with: the timeouts in force and where each came from."""
        self.query_one("#run-settings", Static).update(
            rollout_settings_line(rollout, self.detail.plan.rollout.harness)
            if rollout and self.detail
            else ""
        )

    @on(DataTable.RowHighlighted, "#rollouts-table")
    def _rollout_highlighted(self) -> None:
        self._show_settings(self._selected_rollout())

    def _selected_rollout(self) -> RolloutResult | None:
        table = self.query_one("#rollouts-table", DataTable)
        if not self.detail or table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((r for r in self.detail.rollouts if r.rollout_id == key), None)

    def action_open_rollout(self) -> None:
        """Open the highlighted rollout's capture session."""
        rollout = self._selected_rollout()
        if rollout is None:
            self.app.notify(
                "No rollout to open: start a batch on Setup." if not self.runs else "No rollout highlighted.",
                severity="warning",
            )
            return
        if not rollout.session_id:
            self.app.notify("This rollout has no capture session yet.", severity="warning")
            return
        self.app.open_rollout(rollout.session_id, self.link)

    def action_inside(self) -> None:
        """Open the highlighted rollout's sandbox: its processes and its agent's own output."""
        rollout = self._selected_rollout()
        if rollout is None or self.link is None:
            self.app.notify("No rollout highlighted.", severity="warning")
            return
        self.app.push_screen(
            SandboxScreen(self.link.client, rollout.run_id or self.run_id or "", rollout.rollout_id)
        )

    @on(DataTable.RowSelected, "#rollouts-table")
    def _rollout_selected(self) -> None:
        self.action_open_rollout()

    def _where(self, link: ServerLink) -> str:
        """What follows a run's id in a notification with several servers: " on NAME"."""
        return f" on {link.name}" if self.app.links.several else ""

    def action_export(self, fmt: str) -> None:
        """Export the shown run's training data (on its server's machine)."""
        shown = self.listed.get(self.run_key or "")
        if shown is None:
            self.app.notify("No run to export.", severity="warning")
            return
        link, run = shown
        self.export_run(link, run.id, fmt)

    @work(group="export", exit_on_error=False)
    async def export_run(self, link: ServerLink, run_id: str, fmt: str) -> None:
        self.app.notify(f"exporting run {run_id}{self._where(link)} as {fmt}…")
        result = await link.client.export_run(run_id, fmt)
        self.app.notify(f"wrote {result.path}{self._where(link)}", title="Export done", timeout=10)

    def action_cancel(self) -> None:
        """Cancel the shown run: the first press asks, a second one within CONFIRM_S cancels."""
        shown = self.listed.get(self.run_key or "")
        if shown is None:
            self.app.notify("No run to cancel: start a batch on Setup.", severity="warning")
            return
        link, run = shown
        if run.state != "running":
            self._cancel.disarm()
            self.app.notify(f"run {run.id} already {run.state}: nothing to cancel.", severity="warning")
            return
        if not self._cancel.press(self.run_key or run.id, self.app.clock()):
            from tapdeck.app.screen_registry import key_of  # the registry imports this screen

            left = run.counts.total - run.counts.done
            self.app.notify(
                f"{left} rollout(s) of run {run.id}{self._where(link)} still to run. Press "
                f"{key_of(self.app, 'runs.cancel', self)} again "
                f"within {CONFIRM_S:g} s to cancel it.",
                title="Cancel run?",
                severity="warning",
                timeout=CONFIRM_S,
            )
            return
        self.cancel_run(link, run.id)

    def action_resume(self) -> None:
        """Resume the shown run: its never-run, cancelled and engine-unreachable rollouts run again."""
        detail, link = self.detail, self.link
        if detail is None or link is None:
            self.app.notify("No run to resume.", severity="warning")
            return
        left = sum(runs_again_on_resume(r) for r in detail.rollouts)
        if detail.state == "running":
            self.app.notify(f"run {detail.id} is running.", severity="warning")
        elif not left:
            self.app.notify(
                f"Nothing to resume: every rollout of run {detail.id} ran to its end.", severity="warning"
            )
        else:
            self.resume_run(link, detail.id, left)

    @work(group="resume", exit_on_error=False)
    async def resume_run(self, link: ServerLink, run_id: str, left: int) -> None:
        await link.client.resume_run(run_id)
        self.app.notify(f"run {run_id}{self._where(link)} resumed: {left} rollout(s) to run")
        self.load_runs()

    @work(group="cancel", exit_on_error=False)
    async def cancel_run(self, link: ServerLink, run_id: str) -> None:
        state = (await link.client.cancel_run(run_id)).state
        if state == "running":
            # A started run ends once its sandboxes are torn down, after the reply: say so, and
            # say how it ended once it has.
            self.app.notify(f"run {run_id}{self._where(link)} cancelling: its rollouts are stopping")
            self.load_runs()
            deadline = asyncio.get_running_loop().time() + CANCEL_WAIT_S
            while state == "running" and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.5)
                state = (await link.client.run(run_id)).state
        if state != "running":
            self.app.notify(f"run {run_id}{self._where(link)} {state}")
        self.load_runs()

    def action_drift(self) -> None:
        """Open the shown run's |Δ| histogram (its sessions' latest replays)."""
        if self.detail is None or self.link is None:
            self.app.notify("No run shown: nothing to measure.", severity="warning")
            return
        sessions = [r.session_id for r in self.detail.rollouts if r.session_id]
        self.app.push_screen(RunDriftScreen(self.link.client, self.detail.id, sessions))
