"""Runs: batches with per-task groups, rewards, pass rates and failures by cause; export a run."""

from __future__ import annotations

from collections.abc import Iterable

from textual import on, work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import DataTable, Static

from tapdeck.app.histogram import bars, histogram, reward_line
from tapdeck.app.screens.base import TapdeckScreen
from tapdeck.app.views import (
    failures_by_cause,
    fmt_phase,
    fmt_rate,
    fmt_reward,
    rollout_settings_line,
    run_groups,
    short_id,
)
from tapdeck.schema.runs import RolloutResult, RunDetail, RunSummary, runs_again_on_resume


GROUP_BINS = 5
"""A group's reward histogram: five bins over 0-1 (K is small; ten would be mostly empty)."""


class RunsScreen(TapdeckScreen):
    """Top: all runs. Below: the highlighted run's groups, failures and rollouts."""

    MODE = "runs"
    # Under 120 columns the groups and the rollouts stack: side by side, neither table fits.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    HELP = ("Batches started from Setup (or the CLI). Enter shows a run's groups; o opens the "
            "highlighted rollout; e / p export the run as JSONL / Parquet on the server's machine; "
            "u resumes a stopped run (its cancelled and never-run rollouts run again).")

    BINDINGS = [
        Binding("e", "export('jsonl')", "Export JSONL", id="runs.export_jsonl"),
        Binding("p", "export('parquet')", "Parquet", id="runs.export_parquet"),
        Binding("x", "cancel", "Cancel run", id="runs.cancel"),
        Binding("u", "resume", "Resume", id="runs.resume"),
        Binding("o", "open_rollout", "Open rollout", id="runs.open"),
        Binding("r", "reload", "Reload", id="runs.reload"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[RunSummary] = []
        self.run_id: str | None = None
        self.detail: RunDetail | None = None

    def compose_body(self) -> Iterable[Widget]:
        runs = DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        runs.add_columns("run", "state", "done", "ok", "failed", "reward", "pass")
        yield runs
        yield Static("", id="run-header")
        yield Static("", id="run-settings")
        with Horizontal(id="run-detail"):
            with Vertical(id="groups-pane"):
                groups = DataTable(id="groups-table", cursor_type="row")
                groups.add_columns("task", "done", "rewards", "mean", "pass", "hist")
                yield groups
                yield Static("", id="failures")
            rollouts = DataTable(id="rollouts-table", cursor_type="row")
            rollouts.add_columns("task", "#", "phase", "reward", "turns", "error")
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
        runs = await self.client.runs()
        self.runs = sorted(runs, key=lambda r: r.created_at, reverse=True)
        table = self.query_one("#runs-table", DataTable)
        cursor = table.cursor_row
        with self.app.batch_update():
            table.clear()
            for run in self.runs:
                counts = run.counts
                table.add_row(short_id(run.id, 12), run.state, f"{counts.done}/{counts.total}",
                              str(counts.ok), str(counts.failed), fmt_reward(run.mean_reward),
                              fmt_rate(run.pass_rate), key=run.id)
            if self.runs:
                table.move_cursor(row=min(cursor, len(self.runs) - 1))
        if not self.runs:
            self.query_one("#run-header", Static).update("No runs yet: start a batch on Setup (1).")
            return
        wanted = self.run_id if any(r.id == self.run_id for r in self.runs) else self.runs[0].id
        self.run_id = wanted
        detail = await self.client.run(wanted)
        self.show_detail(detail)

    @on(DataTable.RowHighlighted, "#runs-table")
    def _run_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value if event.row_key else None
        if key and key != self.run_id:
            self.run_id = key
            self.load_detail(key)

    @work(exclusive=True, group="run-detail", exit_on_error=False)
    async def load_detail(self, run_id: str) -> None:
        self.show_detail(await self.client.run(run_id))

    def show_detail(self, detail: RunDetail) -> None:
        """Groups, failures and rollouts of one run."""
        self.detail = detail
        plan = detail.plan
        self.query_one("#run-header", Static).update(
            f"run {detail.id} · {plan.dataset or 'sample'} · {plan.rollout.harness} · "
            f"{plan.rollout.sandbox} · {plan.rollout.engine} · K={plan.k}")
        rollouts = detail.rollouts
        groups = self.query_one("#groups-table", DataTable)
        table = self.query_one("#rollouts-table", DataTable)
        with self.app.batch_update():
            groups.clear()
            for group in run_groups(rollouts):
                groups.add_row(group.task[:28], f"{group.done}/{group.total}",
                               " ".join(fmt_reward(r) for r in group.rewards)[:24],
                               fmt_reward(group.mean), fmt_rate(group.pass_rate),
                               bars(histogram(group.rewards, GROUP_BINS)), key=group.task)
            table.clear()
            for r in sorted(rollouts, key=lambda r: (r.task, r.index)):
                table.add_row(r.task[:24], str(r.index), fmt_phase(r), fmt_reward(r.reward),
                              str(r.turns), r.error_kind or "", key=r.rollout_id)
        self._show_settings(self._selected_rollout())
        failures = failures_by_cause(rollouts)
        self.query_one("#failures", Static).update(
            f"rewards {reward_line(r.reward for r in rollouts)}\n"
            + ("failures: " + ", ".join(f"{kind} {n}" for kind, n in failures.most_common())
               if failures else "failures: none"))

    def _show_settings(self, rollout: RolloutResult | None) -> None:
        """What the highlighted rollout ran with: the timeouts in force and where each came from."""
        self.query_one("#run-settings", Static).update(
            rollout_settings_line(rollout) if rollout else "")

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
        if rollout is None or not rollout.session_id:
            self.app.notify("This rollout has no capture session yet.", severity="warning")
            return
        self.app.open_rollout(rollout.session_id)

    @on(DataTable.RowSelected, "#rollouts-table")
    def _rollout_selected(self) -> None:
        self.action_open_rollout()

    def action_export(self, fmt: str) -> None:
        """Export the shown run's training data."""
        if not self.run_id:
            self.app.notify("No run to export.", severity="warning")
            return
        self.export_run(self.run_id, fmt)

    @work(group="export", exit_on_error=False)
    async def export_run(self, run_id: str, fmt: str) -> None:
        self.app.notify(f"exporting run {run_id} as {fmt}…")
        result = await self.client.export_run(run_id, fmt)
        self.app.notify(f"wrote {result.path}", title="Export done", timeout=10)

    def action_cancel(self) -> None:
        """Cancel the shown run."""
        if self.run_id:
            self.cancel_run(self.run_id)

    def action_resume(self) -> None:
        """Resume the shown run: its never-run and cancelled rollouts run again."""
        detail = self.detail
        if detail is None:
            self.app.notify("No run to resume.", severity="warning")
            return
        left = sum(runs_again_on_resume(r) for r in detail.rollouts)
        if detail.state == "running":
            self.app.notify(f"run {detail.id} is running.", severity="warning")
        elif not left:
            self.app.notify(f"Nothing to resume: every rollout of run {detail.id} ran to its end.",
                            severity="warning")
        else:
            self.resume_run(detail.id, left)

    @work(group="resume", exit_on_error=False)
    async def resume_run(self, run_id: str, left: int) -> None:
        await self.client.resume_run(run_id)
        self.app.notify(f"run {run_id} resumed: {left} rollout(s) to run")
        self.load_runs()

    @work(group="cancel", exit_on_error=False)
    async def cancel_run(self, run_id: str) -> None:
        await self.client.cancel_run(run_id)
        self.app.notify(f"run {run_id} cancelled")
        self.load_runs()
