"""`tapdeck train`: launch a training recipe as a job of a tapdeck server, stream its log, print
its final metrics.

Everything goes through the server API (`/admin/train`), so the recipe runs on the server's machine:
with `--server URL` that is a remote server (a GPU box through `ssh -L`), without it a server
started in this process on a free loopback port. `--list` says which recipes exist and whether the
server's machine can start each. With `--run RUN_ID`, `data-check` checks that rollout run's rows
(the server exports them); a recipe that reads rows and is given none (`--run`, or its own
`--rows PATH`) is refused before any job starts (exit 2). Everything after the options is passed to
the recipe unchanged. `--dry-run` prints what a launch would run (for grpo-trl: vLLM's command
and the trainer's, and the GPUs each gets) and starts nothing. Ctrl-C stops the recipe (SIGTERM,
then SIGKILL of its process group). A run that logged a held-out eval (cpu-grpo) ends with one line:
its verifier reward before training → after, with n and 95% intervals, and the difference.
"""

from __future__ import annotations

import asyncio
import shlex
import ssl
from pathlib import Path
from typing import Annotated, Any

import typer

from tapdeck.app.client import ApiError, TapdeckClient, command_admin_key
from tapdeck.app.commands.options import AdminKeyOption, DataDirOption, ServerCaFileOption, server_option
from tapdeck.app.eval_reward import eval_reward, summary_line
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_OK, EXIT_USAGE, CommandError
from tapdeck.runner.recipes import CPU_TRAINING, DEFAULT_RECIPE, RECIPES
from tapdeck.schema.train import TrainLogEvent, TrainPlan, TrainRunInfo, TrainStateEvent

# Metrics printed at the end when the recipe logged them (TRL's names under trackio's `train/` prefix).
HEADLINE = (
    "train/reward",
    "train/reward_std",
    "train/loss",
    "train/kl",
    "train/frac_reward_zero_std",
    "train/batch/trained_tokens_per_step",
    "train/batch/samples_per_step",
    "train/rollout/fork_frac",
    "check/rows_valid_total",
    "check/rows_invalid_total",
    "check/trained_tokens_total",
)


def describe_recipes(recipes: list[Any]) -> str:
    """The `--list` text, from the server's `GET /admin/train/recipes`."""
    lines = []
    for r in recipes:
        here = "can start there" if r.available else "cannot start there"
        lines += [
            f"{r.name}  [{here}]",
            f"    where: {r.where}",
            f"    updates weights: {'yes' if r.updates_weights else 'no'}",
            f"    {r.summary}",
            f"    {r.why}",
        ]
    lines.append(CPU_TRAINING)
    return "\n".join(lines)


def describe_plan(plan: TrainPlan, base: str) -> str:
    """The `--dry-run` text: each command as a shell line, who starts it and on which GPUs."""
    lines = [f"[tapdeck] dry run of {plan.recipe} on {base}: nothing started"]
    for command in plan.commands:
        who = "you start it" if command.started_by == "operator" else "the server starts it"
        gpus = f"GPU {','.join(command.gpus)}" if command.gpus else "no GPU split"
        lines += [
            f"{command.role} ({who}; {gpus}):",
            "  " + shlex.join([f"{k}={v}" for k, v in command.env.items()] + command.argv),
        ]
    lines += [f"note: {note}" for note in plan.notes]
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add the `train` command."""

    @app.command("train", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def train(
        ctx: typer.Context,
        recipe: str = typer.Option(
            DEFAULT_RECIPE, "--recipe", help="data-check, cpu-grpo or grpo-trl (see --list)."
        ),
        run: str | None = typer.Option(
            None,
            "--run",
            help="A tapdeck rollout run id: the rows "
            "data-check checks, the dataset, tasks and harness grpo-trl "
            "trains on; cpu-grpo takes none.",
        ),
        data_dir: DataDirOption = None,
        server: Annotated[
            str | None, server_option("Run it as a job of this tapdeck server instead of one started here.")
        ] = None,
        admin_key: AdminKeyOption = None,
        ca_file: ServerCaFileOption = None,
        list_: bool = typer.Option(False, "--list", help="List recipes and whether the server can run each."),
        dry_run: bool = typer.Option(
            False,
            "--dry-run",
            help="Print the commands a launch would run (vLLM's and the trainer's for grpo-trl) "
            "and the GPUs each gets; start nothing.",
        ),
    ) -> None:
        """Launch a training recipe on a tapdeck server; stream its log; print its final metrics.
        Extra args go to the recipe."""
        from tapdeck.proxy.config import ServerConfig, default_data_dir
        from tapdeck.runner.run_dir import is_run_id

        if run is not None and not is_run_id(run):  # as `export`: a path is no run's id
            raise CommandError(
                EXIT_USAGE,
                f"tapdeck train: --run {run!r} is not a run id: give a plain id (run-…), not a path",
            )
        if ctx.args and ctx.args[0] in RECIPES:
            # `tapdeck train cpu-grpo` would hand the name to the default recipe as an argument.
            raise CommandError(
                EXIT_USAGE,
                f"tapdeck train: give the recipe as an option: tapdeck train --recipe {ctx.args[0]} ...",
            )
        known = RECIPES.get(recipe)  # an unknown one is the server's to refuse, naming those it has
        if (
            not list_
            and known is not None
            and (why := known.rows_missing(run, ctx.args) or known.run_refused(run))
        ):
            # Its job would only die of its argument parser's usage error.
            raise CommandError(EXIT_USAGE, f"tapdeck train: {why}")
        data = (data_dir or default_data_dir()).expanduser()
        local = None
        key: str | None  # the local server's, else the one given or found for `server`
        if server is None:
            from pydantic import ValidationError

            from tapdeck.app.failures import validation_line
            from tapdeck.app.host import LocalServer

            try:
                config = ServerConfig(port=0, data_dir=data)
            except ValidationError as exc:
                raise CommandError(EXIT_USAGE, f"tapdeck train: {validation_line(exc)}") from None
            try:
                local = LocalServer(config).start()
            except Exception as exc:  # noqa: BLE001 - any start failure: a clear line, not a traceback
                raise CommandError(
                    EXIT_COULD_NOT_RUN, f"tapdeck train: could not start a local server: {exc}"
                ) from None
            base, key, trust = local.url, local.admin_key, local.client_trust
        else:
            from tapdeck.schema.addresses import http_base_url
            from tapdeck.schema.tls import server_trust

            try:
                base = http_base_url(server, "--server")
                key = command_admin_key(admin_key, data)
                trust = server_trust(ca_file)
            except ValueError as exc:
                raise CommandError(EXIT_USAGE, f"tapdeck train: {exc}") from None
        try:
            code = asyncio.run(
                _drive(
                    base,
                    key,
                    recipe,
                    run,
                    list(ctx.args),
                    list_,
                    dry_run=dry_run,
                    verify=trust,
                    key_dir=None if local is not None or admin_key else data,
                )
            )
        finally:
            if local is not None:
                local.stop()
        raise typer.Exit(code)


async def _drive(
    base: str,
    key: str | None,
    recipe: str,
    run: str | None,
    args: list[str],
    list_only: bool,
    *,
    dry_run: bool = False,
    key_dir: Path | None = None,
    verify: ssl.SSLContext | bool = True,
) -> int:
    """List the recipes or run one to its end; the exit code (README: 2 for an unknown recipe or
    recipe args its parser refuses). `verify`: what an https server's certificate is checked against."""
    client = TapdeckClient(base, key, verify=verify)
    try:
        try:
            if list_only:
                typer.echo(describe_recipes(await client.train_recipes()))
                return EXIT_OK
            if dry_run:
                typer.echo(describe_plan(await client.train_plan(recipe, run=run, args=args), base))
                return EXIT_OK
            if run is not None and (known := RECIPES.get(recipe)) is not None and known.takes_run:
                await _warn_if_still_going(client, recipe, run)
            job = await client.start_train(recipe, run=run, args=args)
        except ApiError as exc:
            typer.echo(f"tapdeck train: {exc.for_command(key_dir, key_found=bool(key))}", err=True)
            # 422: the recipe's own parser refused its args; else an unknown recipe is bad usage.
            if exc.kind == "rejected" and (exc.status == 422 or await _unknown_recipe(client, recipe)):
                return EXIT_USAGE
            return EXIT_COULD_NOT_RUN
        typer.echo(f"[tapdeck] training run {job.id} ({job.recipe}) on {base}, in {job.run_dir}")
        try:
            final = await _follow(client, job.id)
        except (KeyboardInterrupt, asyncio.CancelledError):
            typer.echo("[tapdeck] stopping the recipe…", err=True)
            final = await client.stop_train(job.id)
        _print_summary(final, await _metric_series(client, job.id))
        return EXIT_OK if final.state == "finished" else EXIT_COULD_NOT_RUN
    finally:
        await client.aclose()


async def _follow(client: TapdeckClient, run_id: str) -> TrainRunInfo:
    """Print the run's log as it arrives; its last state."""
    last = None
    async for event in client.train_events(run_id):
        if isinstance(event, TrainLogEvent):
            for line in event.lines:
                typer.echo(line)
        elif isinstance(event, TrainStateEvent):
            last = event.run
    return last if last is not None else await client.train_run(run_id)


async def _warn_if_still_going(client: TapdeckClient, recipe: str, run: str) -> None:
    """Warn, as the Train screen does, that a run still going is read only as far as it got
    (allowed: a first look at a long batch, but its groups may be cut short)."""
    try:
        going = await client.run(run)
    except ApiError:  # no such run: the launch says so
        return
    if going.state == "running":
        typer.echo(
            f"tapdeck train: run {run} is still going: {recipe} reads the "
            f"{going.counts.done} of {going.counts.total} rollouts done so far",
            err=True,
        )


async def _unknown_recipe(client: TapdeckClient, recipe: str) -> bool:
    """Whether the server has no recipe of that name (a refusal for any other reason is not 2)."""
    try:
        return recipe not in {r.name for r in await client.train_recipes()}
    except ApiError:
        return False


async def _metric_series(client: Any, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric the run logged: its (step, value) points in logging order."""
    series: dict[str, list[tuple[int, float]]] = {}
    for p in (await client.train_metrics(run_id)).points:
        series.setdefault(p.name, []).append((p.step, p.value))
    return series


def _print_summary(job: Any, series: dict[str, list[tuple[int, float]]]) -> None:
    """The job's end, its headline metrics' last values and, when it ran one, its eval's line."""
    last = {name: points[-1] for name, points in series.items()}
    code = "-" if job.exit_code is None else job.exit_code
    typer.echo(f"[tapdeck] {job.id}: {job.state} (exit code {code}); log {job.run_dir}/train.log")
    if job.error:
        typer.echo(f"[tapdeck] why: {job.error}")
    shown = [n for n in HEADLINE if n in last] or sorted(last)[:8]
    for name in shown:
        step, value = last[name]
        typer.echo(f"  {name} = {value:.6g} (step {step})")
    if not last:
        typer.echo("  (no trackio metrics logged)")
    if (ev := eval_reward(series)) is not None:
        typer.echo(f"[tapdeck] {summary_line(ev)}")
