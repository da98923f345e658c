"""`tapdeck replay SESSION|RUN --engine URL|embedded`: score a captured rollout's sampled tokens
under a reference engine and print the drift (runner/replay), straight on the data dir's store (no
server). The replay is stored beside the capture (`tapdeck export` then adds its columns);
`--delete` removes one again, leaving the capture as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tapdeck.app.commands.options import DataDirOption, EngineApiKeyOption, EngineModelOption, engine_option
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_USAGE, CommandError

if TYPE_CHECKING:
    from tapdeck.proxy.store.database import Store
    from tapdeck.schema.replay import DriftFigures, ReplayResult


def _figures_line(figures: DriftFigures) -> str:
    from tapdeck.runner.recipes.logprob_mismatch import MAX, MEAN, OUTSIDE
    from tapdeck.runner.replay.drift import K3_KL

    m = figures.metrics
    return (
        f"{figures.tokens} tokens  mean|Δ| {m[MEAN]:.4f}  max|Δ| {m[MAX]:.4f}  "
        f"k3 KL {m[K3_KL]:.5f}  ratio outside [0.5, 2] {m[OUTSIDE]:.1%}"
    )


def _print_replay(result: ReplayResult) -> None:
    for turn in result.turns:
        if turn.figures is None:
            typer.echo(f"  turn {turn.seq}: not scored: {turn.reason}")
        else:
            typer.echo(f"  turn {turn.seq}: {_figures_line(turn.figures)}")
    how = f"{result.requests} request(s)" + (
        ", a chain cut at the reference's context" if result.chunked else ""
    )
    if result.session is None:
        typer.echo(f"session {result.session_id}: no turn could be scored (replay {result.id}, {how})")
        return
    typer.echo(f"session {result.session_id}: {_figures_line(result.session)} (replay {result.id}, {how})")
    for token in result.session.largest[:5]:
        typer.echo(
            f"  Δ {token.delta:+.4f}  turn {token.seq} token {token.index} {token.text!r} "
            f"(sampler {token.sampler_logprob:.4f}, reference {token.reference_logprob:.4f})"
        )


def register(app: typer.Typer) -> None:
    """Add the `replay` command."""

    @app.command("replay")
    def replay(
        target: str = typer.Argument(
            ..., help="A session id (s-…) or a run id; with --delete, a replay id (rp-…)."
        ),
        engine: Annotated[
            str,
            engine_option(
                "The reference engine: `embedded`, or an engine serving vLLM's prompt_logprobs: "
                "HOST:PORT, http://HOST:PORT or …/v1."
            ),
        ] = "embedded",
        engine_model: EngineModelOption = None,
        engine_api_key: EngineApiKeyOption = None,
        delete: bool = typer.Option(False, "--delete", help="Delete the replay TARGET; the capture stays."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as the server's route answers."),
        data_dir: DataDirOption = None,
    ) -> None:
        """Score a session's or a run's sampled tokens under a reference engine; print the drift."""
        from tapdeck.app.commands.stored_capture import stored_capture
        from tapdeck.proxy.config import CAPTURE_DB
        from tapdeck.runner.run_dir import is_run_id

        if not is_run_id(target):
            raise CommandError(
                EXIT_USAGE, f"tapdeck replay: {target!r} is not an id: give a plain id, not a path"
            )
        with stored_capture(data_dir, "replay", read_only=False) as (root, store):
            if delete:
                if not store.delete_replay(target):
                    db = root / CAPTURE_DB
                    raise CommandError(EXIT_COULD_NOT_RUN, f"tapdeck replay: no replay {target} in {db}")
                typer.echo(f"deleted replay {target}; the capture is unchanged")
                return
            _replay(store, root / "runs" / target, target, engine, engine_model, engine_api_key, as_json)


def _replay(
    store: Store,
    run_dir: Path,
    target: str,
    engine: str,
    model: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    from tapdeck.runner.errors import RunnerError
    from tapdeck.runner.replay.reference import ReferenceEngine
    from tapdeck.runner.replay.session import replay_run, replay_session

    is_session = target in {s["id"] for s in store.list_sessions()}
    if not is_session and not run_dir.is_dir():
        raise CommandError(EXIT_COULD_NOT_RUN, f"tapdeck replay: {target!r} is neither a session nor a run")
    shared = None
    try:
        if engine.strip().lower() == "embedded":
            from tapdeck.runner.engine.registry import acquire_embedded_engine

            typer.echo("starting the embedded engine (or reusing the one another process serves)…", err=True)
            shared = acquire_embedded_engine()
            reference = ReferenceEngine.at(
                shared.base_url, model=model or shared.served_name, name="embedded"
            )
        else:
            reference = ReferenceEngine.at(engine, model=model, api_key=api_key)
        try:
            if is_session:
                result, _ = replay_session(store, target, reference)
                if as_json:
                    typer.echo(result.model_dump_json(indent=2))
                else:
                    _print_replay(result)
                return
            run = replay_run(store, run_dir, reference)
        finally:
            reference.close()
    except RunnerError as exc:
        raise CommandError(EXIT_COULD_NOT_RUN, f"tapdeck replay: {exc.message}") from None
    finally:
        if shared is not None:
            shared.stop()
    if as_json:
        typer.echo(run.model_dump_json(indent=2))
        return
    for replayed in run.replays:
        _print_replay(replayed)
    for line in run.skipped:
        typer.echo(f"skipped {line}")
    if run.run is not None:
        typer.echo(f"run {run.run_id}: {_figures_line(run.run)}")
