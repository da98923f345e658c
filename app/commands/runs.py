"""`tapdeck runs`: the data dir's rollout runs, headless, read from their files.

No server or engine is started and nothing is written, so it answers while a server runs a batch
on the same data dir (a run another process is running shows as `running`, as that process's own
Runs screen does, but with only its finished rollouts: the live ones are in that process).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

from tapdeck.app.commands.options import DataDirOption
from tapdeck.app.commands.runner_warnings import runner_warnings_on_stderr
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_USAGE, CommandError

if TYPE_CHECKING:
    from tapdeck.schema.runs import RunSummary

HARNESS_CHARS = 14
"""The list's harness column: the longest harness name tapdeck offers, so none is cut."""


def register(app: typer.Typer) -> None:
    """Add the `runs` command."""

    @app.command("runs")
    def runs(
        run_id: str | None = typer.Argument(
            None, metavar="RUN", help="A run id: its per-rollout table instead of the list."
        ),
        as_json: bool = typer.Option(
            False,
            "--json",
            help="The list (or the run) as JSON, as the server's GET /admin/runs[/RUN] answers it.",
        ),
        data_dir: DataDirOption = None,
    ) -> None:
        """List the data dir's runs, newest first, or show one run's rollouts as `tapdeck rollout`
        prints them (exit 1: no such run; 2: an id that is a path)."""
        from tapdeck.proxy.config import default_data_dir, usable_data_dir
        from tapdeck.runner.batch import BatchRunner
        from tapdeck.runner.errors import RunNotFound, RunUnreadable
        from tapdeck.runner.run_dir import is_run_id
        from tapdeck.schema.runs import RunDetail, RunList

        if run_id is not None and not is_run_id(run_id):
            raise CommandError(
                EXIT_USAGE, f"tapdeck runs: {run_id!r} is not a run id: give a plain id (run-…), not a path"
            )
        try:
            root = usable_data_dir(data_dir or default_data_dir())
        except ValueError as exc:
            raise CommandError(EXIT_USAGE, f"tapdeck runs: --data-dir: {exc}") from None
        batch = BatchRunner(None, data_dir=root, default_engine=None)
        if run_id is None:
            with runner_warnings_on_stderr("runs"):  # a run left out, a line skipped: said once
                listed = batch.list()
            if as_json:
                typer.echo(RunList(runs=listed).model_dump_json(indent=2))
            elif not listed:
                typer.echo(f"no runs in {batch.runs_dir} (tapdeck rollout starts one)", err=True)
            else:
                _print_list(listed)
            return
        try:
            with runner_warnings_on_stderr("runs"):
                summary, rollouts = batch.get(run_id)
        except RunNotFound:
            raise CommandError(
                EXIT_COULD_NOT_RUN,
                f"tapdeck runs: no run {run_id} in {batch.runs_dir} (pass the --data-dir it ran in)",
            ) from None
        except RunUnreadable as exc:
            raise CommandError(EXIT_COULD_NOT_RUN, f"tapdeck runs: {exc}") from None
        doc = RunDetail(**dict(summary), rollouts=rollouts)
        if as_json:
            typer.echo(json.dumps(doc.model_dump(mode="json"), indent=2))
            return
        from tapdeck.app.commands.run_table import print_run_table

        print_run_table(doc)


def _print_list(listed: list[RunSummary]) -> None:
    """One row per run in at most 80 columns: id (which says when it started), state, harness,
    progress and outcome."""
    from rich.console import Console
    from rich.table import Table

    from tapdeck.app.views.runs import run_outcomes

    console = Console(width=min(80, Console().width))
    table = Table(box=None, pad_edge=False, expand=False, show_edge=False, collapse_padding=True)
    table.add_column("run", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("harness", no_wrap=True, overflow="ellipsis", max_width=HARNESS_CHARS)
    table.add_column("done", justify="right", no_wrap=True)
    table.add_column("ok", justify="right")
    table.add_column("fail", justify="right")
    table.add_column("canc", justify="right")
    table.add_column("reward", justify="right")
    for run in listed:
        failed, cancelled = run_outcomes(run)
        reward = "-" if run.mean_reward is None else f"{run.mean_reward:.2f}"
        table.add_row(
            run.id,
            run.state,
            run.plan.rollout.harness,
            f"{run.counts.done}/{run.counts.total}",
            str(run.counts.ok),
            str(failed),
            str(cancelled),
            reward,
        )
    console.print(table)
