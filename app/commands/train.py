"""`tapdeck train`: launch a training recipe as a subprocess, stream its log, print its final metrics.

`tapdeck train --list` says which recipes exist and where each can run. With `--run RUN_ID` the
`data-check` recipe reads that run's JSONL export (written first, from the capture store, when it
does not exist yet). Everything after the options is passed to the recipe unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

# Metrics printed at the end when the recipe logged them (TRL's names under trackio's `train/` prefix).
HEADLINE = ("train/reward", "train/reward_std", "train/batch/trained_tokens_per_step",
            "train/batch/samples_per_step", "train/loss", "check/rows_valid_total",
            "check/rows_invalid_total", "check/trained_tokens_total")


def ensure_run_export(data_dir: Path, run_id: str) -> Path:
    """`<data_dir>/exports/<run_id>.jsonl`, written from the capture store if it is missing."""
    path = data_dir / "exports" / f"{run_id}.jsonl"
    if path.is_file():
        return path
    from tapdeck.app.commands.export import run_rows
    from tapdeck.proxy.config import CAPTURE_DB
    from tapdeck.proxy.export import write_jsonl
    from tapdeck.proxy.store import Store

    run_dir = data_dir / "runs" / run_id
    if not (run_dir / "results.jsonl").is_file():
        raise FileNotFoundError(f"no run {run_id!r} in {data_dir / 'runs'}")
    if not (data_dir / CAPTURE_DB).is_file():
        raise FileNotFoundError(f"no capture store at {data_dir / CAPTURE_DB}")
    store = Store(data_dir / CAPTURE_DB)
    try:
        rows, _empty = run_rows(store, run_dir)
    finally:
        store.close()
    return write_jsonl(path, rows)


def final_metrics(trackio_dir: Path, project: str, run_name: str) -> dict[str, tuple[int, float]]:
    """The last (step, value) of every metric the run logged."""
    from tapdeck.runner.trackio_reader import TrackioReader

    last: dict[str, tuple[int, float]] = {}
    for p in TrackioReader(trackio_dir, project).read_new():
        if p.run_name == run_name:
            last[p.name] = (p.step, p.value)
    return last


def describe_recipes() -> str:
    """The `--list` text."""
    from tapdeck.runner.recipes import NO_CPU_TRAINING, RECIPES

    lines = []
    for r in RECIPES.values():
        missing = r.missing()
        here = "can start here" if not missing else f"cannot start here (missing: {', '.join(missing)})"
        lines += [f"{r.name}  [{here}]", f"    where: {r.where}",
                  f"    updates weights: {'yes' if r.updates_weights else 'no'}", f"    {r.summary}"]
    lines.append(NO_CPU_TRAINING)
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add the `train` command."""

    @app.command("train", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def train(
        ctx: typer.Context,
        recipe: str = typer.Option("data-check", "--recipe", help="data-check or grpo-trl (see --list)."),
        run: str | None = typer.Option(None, "--run", help="A tapdeck run id to train on / check."),
        data_dir: Path | None = typer.Option(None, "--data-dir",
                                             help="Data directory (default $TAPDECK_DATA_DIR or ~/.tapdeck)."),
        list_: bool = typer.Option(False, "--list", help="List recipes and where each can run."),
    ) -> None:
        """Launch a training recipe; stream its log; print its final metrics. Extra args go to the recipe."""
        if list_:
            typer.echo(describe_recipes())
            return
        from tapdeck.proxy.config import default_data_dir
        from tapdeck.runner.recipes import get_recipe
        from tapdeck.runner.training import TrainingRun

        try:
            spec = get_recipe(recipe)
        except ValueError as exc:
            typer.echo(f"tapdeck train: {exc}", err=True)
            raise typer.Exit(2) from None
        root = data_dir or default_data_dir()
        args: list[str] = list(ctx.args)
        if run is not None:
            if spec.name == "data-check":
                try:
                    args = ["--rows", str(ensure_run_export(root, run)), *args]
                except FileNotFoundError as exc:
                    typer.echo(f"tapdeck train: {exc}", err=True)
                    raise typer.Exit(1) from None
            else:
                args = ["--run", run, *args]
        missing = spec.missing()
        if missing:
            typer.echo(f"tapdeck train: note: {spec.name} needs {', '.join(missing)}, not installed "
                       f"here ({spec.where}); starting it anyway so you see its own message", err=True)
        job = TrainingRun(spec, args, data_dir=root, on_line=typer.echo)
        job.start()
        typer.echo(f"[tapdeck] training run {job.run_id} ({spec.name}) in {job.run_dir}")
        try:
            code = job.wait()
        except KeyboardInterrupt:
            code = job.stop()
        _print_summary(job, code)
        if code != 0:
            raise typer.Exit(1)


def _print_summary(job: Any, code: int) -> None:
    from tapdeck.runner.training import TRACKIO_PROJECT

    last = final_metrics(job.trackio_dir, TRACKIO_PROJECT, job.run_id)
    typer.echo(f"[tapdeck] {job.run_id}: {job.state} (exit code {code}); log {job.log_path}")
    shown = [n for n in HEADLINE if n in last] or sorted(last)[:8]
    for name in shown:
        step, value = last[name]
        typer.echo(f"  {name} = {value:.6g} (step {step})")
    if not last:
        typer.echo("  (no trackio metrics logged)")
