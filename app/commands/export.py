"""`tapdeck export SESSION|RUN`: training data files straight from the capture store (no server).

One row per trainable-capable agent turn (its own prompt ids, completion ids, logprobs, loss mask,
request, response), each with its session, rollout, group id and reward — for a run, every rollout
of `<data_dir>/runs/<id>/results.jsonl`, the reward taken from there (`null` = never graded, never
0). Eval rollouts give no rows (they may not be trained on); the count of skipped ones is printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer


def session_rows(store: Any, session_id: str, *, group_id: str | None = None,
                 rollout_id: str | None = None, reward: float | None = None) -> list[dict[str, Any]]:
    """The training rows of one stored session (empty for an eval rollout)."""
    from tapdeck.proxy.export import trace_rows

    record, graph = store.load_graph(session_id)
    return trace_rows(record, graph, record.get("tier", "text"), group_id=group_id,
                      rollout_id=rollout_id, reward=reward)


def run_rows(store: Any, run_dir: Path) -> tuple[list[dict[str, Any]], int]:
    """Rows for every rollout of a run that has a capture session, and how many gave none."""
    from tapdeck.runner.batch import RESULTS, load_results

    rows: list[dict[str, Any]] = []
    empty = 0
    for result in load_results(run_dir / RESULTS).values():
        if not result.session_id:
            empty += 1
            continue
        got = session_rows(store, result.session_id, group_id=str(result.group),
                           rollout_id=result.rollout_id, reward=result.reward)
        for row in got:
            row["run_id"] = result.run_id or run_dir.name
            row["task"] = result.task
        rows.extend(got)
        empty += not got
    return rows, empty


def register(app: typer.Typer) -> None:
    """Add the `export` command."""

    @app.command("export")
    def export(
        target: str = typer.Argument(..., help="A session id (s-…) or a run id."),
        fmt: str = typer.Option("jsonl", "--format", help="jsonl or parquet."),
        out: Path | None = typer.Option(None, "--out", help="Output file (default <data-dir>/exports/<id>.<format>)."),
        data_dir: Path | None = typer.Option(None, "--data-dir",
                                             help="Data directory (default $TAPDECK_DATA_DIR or ~/.tapdeck)."),
    ) -> None:
        """Write a session's or a run's captured rollouts as JSONL or Parquet."""
        from tapdeck.proxy.config import CAPTURE_DB, default_data_dir
        from tapdeck.proxy.export import write_jsonl, write_parquet
        from tapdeck.proxy.store import Store

        if fmt not in ("jsonl", "parquet"):
            typer.echo(f"tapdeck export: --format must be jsonl or parquet, not {fmt!r}", err=True)
            raise typer.Exit(2)
        root = data_dir or default_data_dir()
        db = root / CAPTURE_DB
        if not db.exists():
            typer.echo(f"tapdeck export: no capture store at {db}", err=True)
            raise typer.Exit(1)
        store = Store(db)
        try:
            run_dir = root / "runs" / target
            if (run_dir / "results.jsonl").exists():
                rows, empty = run_rows(store, run_dir)
            elif target in {s["id"] for s in store.list_sessions()}:
                rows = session_rows(store, target)
                empty = int(not rows)
            else:
                typer.echo(f"tapdeck export: {target!r} is neither a session in {db} nor a run "
                           f"in {root / 'runs'}", err=True)
                raise typer.Exit(1)
        finally:
            store.close()
        path = out or root / "exports" / f"{target}.{fmt}"
        path.parent.mkdir(parents=True, exist_ok=True)
        (write_jsonl if fmt == "jsonl" else write_parquet)(path, rows)
        note = f" ({empty} rollout(s) without training rows: eval tier or no calls)" if empty else ""
        typer.echo(f"wrote {len(rows)} turn row(s) to {path}{note}")
