"""A run as a table: one row per rollout, why the failed ones failed, and the run's summary lines.

What `tapdeck rollout` prints when its run ends and `tapdeck runs RUN` prints for a run on disk.
"""

from __future__ import annotations

from tapdeck.schema.runs import ENDED_PHASES, RolloutResult, RunDetail

ERROR_LINE_CHARS = 160
"""A failure's line under the table is cut here: two rows of an 80-column terminal at most."""
ERROR_TASKS_NAMED = 3
"""Tasks a failure's line names before it counts the rest."""


def print_run_table(doc: RunDetail, tiny_engine: bool = False) -> None:
    """One row per rollout (task, group, its index in the group, reward, ok, model calls, atif,
    error) in at most 80 columns, then why the failed ones failed and the run's summary lines:
    wrapped on a terminal, one line each in a file."""
    from rich.console import Console
    from rich.table import Table

    from tapdeck.app.views.runs import degenerate_phrase, failures_line, ran_with, run_outcomes

    console = Console(width=min(80, Console().width))
    table = Table(box=None, pad_edge=False, expand=False, show_edge=False, padding=(0, 1, 0, 0))
    table.add_column("task", no_wrap=True, overflow="ellipsis", max_width=20)
    table.add_column("grp", justify="right", width=3)
    table.add_column("#", justify="right", width=2)  # the K rollouts of one task tell apart
    table.add_column("reward", justify="right", width=6)
    table.add_column("ok", width=3)
    table.add_column("calls", justify="right", width=5)  # model calls, not the turn limit
    table.add_column("atif", width=8)
    table.add_column("error", no_wrap=True, overflow="ellipsis", max_width=26)
    for r in doc.rollouts:
        reward = "-" if r.reward is None else f"{r.reward:.2f}"
        # `…` while it may still end ok; a rollout its stopped run never ran is not ok, and not done.
        ok = (
            "yes"
            if r.ok
            else (
                "…"
                if r.phase not in ENDED_PHASES and doc.state == "running"
                else "-"
                if r.phase == "queued"
                else "no"
            )
        )
        table.add_row(
            r.task, str(r.group), str(r.index), reward, ok, str(r.turns), r.atif, r.error_kind or ""
        )
    console.print(table)

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=not console.is_terminal)

    for line in failure_lines(doc.rollouts):
        say(line)
    c = doc.counts
    mean = "-" if doc.mean_reward is None else f"{doc.mean_reward:.3f}"
    rate = "-" if doc.pass_rate is None else f"{doc.pass_rate:.0%}"
    # A cancel is a person's choice, not a failure: counted apart, as `tapdeck runs` and Runs do.
    failed, cancelled = run_outcomes(doc)
    say(
        f"run {doc.id} {doc.state}: {c.done}/{c.total} done, {c.ok} ok, {failed} failed"
        + (f", {cancelled} cancelled" if cancelled else "")
        + degenerate_phrase(c.degenerate, ", ")
    )
    say(f"mean reward {mean} (graded only) · pass rate {rate} (full reward, graded only)")
    if doc.failures:
        say(failures_line(doc.failures))
    lines = {ran_with(r.settings, doc.plan.rollout.harness) for r in doc.rollouts if r.settings is not None}
    for line in sorted(lines):
        say(f"ran with: {line}")
    say(f"results: {doc.path}")
    if tiny_engine and doc.plan.rollout.harness not in ("oracle", "nop"):
        say(
            "note: the embedded model (SmolLM2-135M) exercises capture but never solves tasks "
            "(reward 0); use --engine URL for a real model"
        )


def failure_lines(rollouts: list[RolloutResult]) -> list[str]:
    """Why the rollouts that are not ok failed: one line per distinct error, after the task(s) it
    ended (the table's error column has room for the kind only). An error's first line is kept, and
    a line is cut at ERROR_LINE_CHARS; results.jsonl has the whole text."""
    tasks_by_error: dict[str, list[str]] = {}
    for r in rollouts:
        error = (r.error or "").strip()
        if r.ok or not error:
            continue
        tasks = tasks_by_error.setdefault(error.splitlines()[0], [])
        if r.task not in tasks:
            tasks.append(r.task)
    lines = []
    for error, tasks in tasks_by_error.items():
        named = ", ".join(tasks[:ERROR_TASKS_NAMED])
        if len(tasks) > ERROR_TASKS_NAMED:
            named += f" and {len(tasks) - ERROR_TASKS_NAMED} more"
        line = f"{named}: {error}"
        lines.append(line if len(line) <= ERROR_LINE_CHARS else line[: ERROR_LINE_CHARS - 1] + "…")
    return lines
