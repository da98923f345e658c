"""`tapdeck rollout`: run a batch of rollouts headless and print one row per rollout.

With no flags it runs the sample dataset's first task once with terminus-2 on the host sandbox
against the embedded engine (offline, no key). Without `--server` it starts a tapdeck server in this
process on a free loopback port; with `--server URL` it submits the run to that server instead.
The small embedded model never solves tasks (reward 0): it exercises capture, not skill.

Exit codes (also in `--help` and the README): 0 every rollout ok (a `--resume` of a run whose
rollouts all ran to their end says so and runs nothing); 1 the run could not be run (no server, no
engine answering, a dataset source that does not answer, server error); 2 bad usage (an unknown
option, options that conflict, or a plan the server refused: unknown dataset, task, harness,
sandbox, engine address or model); 3 the run ended with some rollout not ok (failed, or
cancelled). A run where no rollout reached the engine is 1, as a local engine that does not
answer is.

While it follows a run it polls the server; a server that stops answering is tried again with a
growing pause, and after SERVER_GRACE_S of silence the command gives up (exit 1) saying how to
follow or resume the run. A local run on an embedded engine reused from another process is
cancelled (exit 1) when that engine goes away, rather than failing every call against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from pydantic import ValidationError

from tapdeck.app.client import CA_FILE_HELP, ApiError, TapdeckClient, admin_key_refusal
from tapdeck.app.commands.run_table import print_run_table
from tapdeck.runner.harnesses import calls_a_model
from tapdeck.runner.rollout_settings import DEFAULT_HARD_LIMIT_S, DEFAULT_MAX_TURNS, MIN_OUTPUT_TOKENS, OUTPUT_SHARE, PROMPT_SHARE
from tapdeck.schema.runs import (
    RolloutTemplate,
    RunDetail,
    RunPlan,
    RunSummary,
    runs_again_on_resume,
)
from tapdeck.schema.tls import CA_FILE_ENV

if TYPE_CHECKING:
    from tapdeck.runner.engine.registry import SharedEngine

POLL_S = 1.0
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 5.0
"""Pause before the first retry at a server that does not answer, doubling up to the most."""
SERVER_GRACE_S = 60.0
"""How long a server may not answer before the command gives up following the run (a loaded
machine can stall a server for a while; a dead one never comes back)."""
NOT_PLAN_OPTIONS = frozenset({"data_dir", "server", "admin_key", "ca_file", "resume"})
"""Options that say where the run is; every other one shapes a new run's plan."""
LOCAL_ENGINE_OPTIONS = frozenset({"engine", "engine_model"})
"""Without --server these pick the local server's engine, which a resumed run uses again."""
SETTINGS_PANEL = "Rollout settings (unset: the default shown; bad values refused, field named)"
EXIT_OK, EXIT_COULD_NOT_RUN, EXIT_USAGE, EXIT_ROLLOUT_FAILED = 0, 1, 2, 3
"""2 is also what the command line parser exits with for an unknown option or a bad value."""
EXIT_CODES_HELP = (
    "Exit codes: 0 every rollout ok (or, with --resume, none left to run); 1 the run could not be "
    "run (server, engine or dataset source not answering); 2 bad usage (unknown option, options "
    "that conflict, or a plan the server refused); 3 the run ended with some rollout not ok (failed "
    "or cancelled; the table says why).")


def register(app: typer.Typer) -> None:
    """Add the `rollout` command."""

    @app.command("rollout", epilog=EXIT_CODES_HELP)
    def rollout(
        ctx: typer.Context,
        dataset: str | None = typer.Option(None, "--dataset", help="Dataset: a local folder, a Harbor "
                                           "registry name, a git URL (default: the sample dataset)."),
        task: list[str] | None = typer.Option(None, "--task", help="Task name (repeatable; default: "
                                              "the first -n tasks)."),
        harness: str = typer.Option("terminus-2", "--harness", help="Agent harness."),
        sandbox: str = typer.Option("host", "--sandbox", help="Sandbox: host or a Harbor backend."),
        engine: str = typer.Option("embedded", "--engine", help="`embedded`, or an engine: HOST:PORT, http://HOST:PORT or …/v1."),
        engine_model: str | None = typer.Option(None, "--engine-model", help="Model name on that engine."),
        n_tasks: int = typer.Option(1, "-n", "--tasks", min=1, help="How many tasks (N)."),
        k: int = typer.Option(1, "-k", "--rollouts", min=1, help="Rollouts per task (GRPO group size)."),
        concurrency: int = typer.Option(1, "-c", "--concurrency", min=1, help="Rollouts at once."),
        reward_key: str | None = typer.Option(None, "--reward-key",
                                              help="Which verifier reward to use when there are several."),
        timeout: float | None = typer.Option(
            None, "--timeout", callback=_finite, help=f"Hard limit per rollout, seconds (default "
            f"{DEFAULT_HARD_LIMIT_S:g}).", rich_help_panel=SETTINGS_PANEL),
        agent_timeout: float | None = typer.Option(
            None, "--agent-timeout", callback=_finite, help="The agent phase's limit, seconds (default: the task's "
            "agent.timeout_sec in task.toml; none if it has none).", rich_help_panel=SETTINGS_PANEL),
        max_turns: int | None = typer.Option(
            None, "--max-turns", help=f"Turn/step limit of the harness (default "
            f"{DEFAULT_MAX_TURNS}).", rich_help_panel=SETTINGS_PANEL),
        max_output_tokens: int | None = typer.Option(
            None, "--max-output-tokens", help=f"Output tokens per model call (default: 1/"
            f"{OUTPUT_SHARE} of the engine's context, at least {MIN_OUTPUT_TOKENS}; at most "
            f"1/{PROMPT_SHARE} of it).", rich_help_panel=SETTINGS_PANEL),
        context_tokens: int | None = typer.Option(
            None, "--context-tokens", help="Context the agent is told it has (default: the "
            "engine's max_model_len; more than that is refused).", rich_help_panel=SETTINGS_PANEL),
        temperature: float | None = typer.Option(
            None, "--temperature", callback=_finite, help="Sampling temperature (default: the harness's own; "
            "enforced on every call of a training-tier session).", rich_help_panel=SETTINGS_PANEL),
        top_p: float | None = typer.Option(None, "--top-p", callback=_finite, help="Truncation knob asked by "
                                           "terminus-2 (reset to its no-op at the training tier).",
                                           rich_help_panel=SETTINGS_PANEL),
        top_k: int | None = typer.Option(None, "--top-k", help="As --top-p.",
                                         rich_help_panel=SETTINGS_PANEL),
        min_p: float | None = typer.Option(None, "--min-p", callback=_finite, help="As --top-p.",
                                           rich_help_panel=SETTINGS_PANEL),
        harness_kwargs: str | None = typer.Option(
            None, "--harness-kwargs", help="Keyword arguments passed verbatim to the Harbor agent, "
            "a JSON object (default: none).", rich_help_panel=SETTINGS_PANEL),
        alternatives: int = typer.Option(0, "--alternatives", min=0, max=20,
                                         help="Top alternatives per sampled token to capture for "
                                         "inspection (default: only what the harness asks for)."),
        data_dir: Path | None = typer.Option(None, "--data-dir",
                                             help="Data directory (default $TAPDECK_DATA_DIR or ~/.tapdeck)."),
        server: str | None = typer.Option(None, "--server", help="Submit to this tapdeck server "
                                          "instead of starting one here."),
        admin_key: str | None = typer.Option(None, "--admin-key", envvar="TAPDECK_ADMIN_KEY",
                                             help="Admin key of --server (default: <data-dir>/admin.key)."),
        ca_file: Path | None = typer.Option(None, "--ca-file", envvar=CA_FILE_ENV,
                                            help=f"With --server: {CA_FILE_HELP}"),
        resume: str | None = typer.Option(None, "--resume", help="Resume an interrupted run by id "
                                          "(finished rollouts are not redone; it runs its stored "
                                          "plan on the engine it used, so plan options and "
                                          "another --engine are refused with it), or "
                                          "follow it if it is running."),
        token_in: bool | None = typer.Option(
            None, "--token-in/--no-token-in", help="Continue held conversations from their token "
            "ids (default: on for training rollouts)."),
        engine_tool_parser: str | None = typer.Option(
            None, "--engine-tool-parser", help="The tool-call parser the engine runs (vLLM's "
            "--tool-call-parser, e.g. hermes): token-in continues calls with tools with it."),
        engine_reasoning_parser: str | None = typer.Option(
            None, "--engine-reasoning-parser", help="The reasoning parser the engine runs, if any: "
            "token-in then sends every call as text."),
        public_url: str | None = typer.Option(
            None, "--public-url", help="Address sandboxes use to reach the proxy (http://HOST:PORT, "
            "e.g. an SSH reverse tunnel); sessions advertise it. Default: the bound address."),
    ) -> None:
        """Run N tasks × K rollouts through the capture proxy and print the results."""
        from tapdeck.app.failures import validation_line
        from tapdeck.proxy.config import ServerConfig, default_data_dir
        from tapdeck.proxy.upstream.address import EngineAddressError
        from tapdeck.runner.run_dir import is_run_id

        data = (data_dir or default_data_dir()).expanduser()
        if resume is not None and not is_run_id(resume):
            typer.echo(f"tapdeck rollout: --resume {resume!r} is not a run id: give the id a run "
                       "was started with (run-…), not a path", err=True)
            raise typer.Exit(EXIT_USAGE)
        if resume is not None and (given := _plan_options_given(ctx, local=server is None)):
            typer.echo(f"tapdeck rollout: --resume runs the run's stored plan, so {', '.join(given)} "
                       "would be ignored; drop them, or start a new run", err=True)
            raise typer.Exit(EXIT_USAGE)
        if task and _given(ctx, "n_tasks"):
            typer.echo("tapdeck rollout: -n/--tasks picks the dataset's first N tasks, so with "
                       "--task, which names them, it would be ignored; drop one of them", err=True)
            raise typer.Exit(EXIT_USAGE)
        try:
            plan = RunPlan(dataset=dataset, tasks=task or None, n_tasks=None if task else n_tasks,
                           k=k, concurrency=concurrency, rollout=RolloutTemplate(
                harness=harness, sandbox=sandbox, engine=engine, engine_model=engine_model,
                engine_tool_parser=engine_tool_parser, engine_reasoning_parser=engine_reasoning_parser,
                timeout_s=timeout, reward_key=reward_key, alternatives=alternatives,
                public_url=public_url, token_in=token_in,
                settings=_settings(agent_timeout_s=agent_timeout, max_turns=max_turns,
                                   max_output_tokens=max_output_tokens, context_tokens=context_tokens,
                                   temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                                   harness_kwargs=harness_kwargs)))
        except ValidationError as exc:
            typer.echo(f"tapdeck rollout: plan refused: {_refusal(exc)}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
        if server is not None:
            _drive_remote(server, admin_key, data, plan, resume, ca_file)
        url_engine = engine if engine.strip().lower() not in ("", "embedded", "default") else None
        try:
            config = ServerConfig(port=0, data_dir=data, engine_url=url_engine, engine_model=engine_model)
        except ValidationError as exc:
            typer.echo(f"tapdeck rollout: {validation_line(exc)}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
        if resume is not None:
            resumed = _check_local_run(data, resume)
            # A resumed run runs its stored plan: its harness, not the option's default, decides.
            harness = resumed.plan.rollout.harness
            if not calls_a_model(harness) and (given := _flags_given(ctx, LOCAL_ENGINE_OPTIONS)):
                # Its server starts no engine, so these would start nothing.
                typer.echo(f"tapdeck rollout: --resume runs run {resume}'s stored plan, whose "
                           f"harness {harness} calls no model, so {', '.join(given)} would be "
                           "ignored; drop them", err=True)
                raise typer.Exit(EXIT_USAGE)
            if calls_a_model(harness):
                url_engine, engine_model = _resumed_engine(ctx, resumed, url_engine, engine_model)
                config = config.model_copy(update={"engine_url": url_engine,
                                                   "engine_model": engine_model})
        _install_agent(harness)
        from tapdeck.app.host import LocalServer
        from tapdeck.proxy.store.no_follow import refuse_link

        plan.rollout.engine = "embedded"  # the server's default engine is the one asked for
        # A run of oracle or nop calls no model: no engine is started (nor need one answer).
        with_engine = calls_a_model(harness)
        if not with_engine:
            starting = f" (no engine: {harness} calls no model)…"
        elif url_engine:
            starting = "…"
        else:
            starting = " and the embedded engine (or reusing the one another tapdeck process serves)…"
        log = data / "rollout.log"
        refuse_link(log)  # before anything starts, so that nothing is left to stop
        typer.echo("starting a local tapdeck server" + starting, err=True)
        try:
            local = LocalServer(config, engine=with_engine).start()
        except EngineAddressError as exc:
            typer.echo(f"tapdeck rollout: {exc}", err=True)
            raise typer.Exit(EXIT_USAGE if exc.status == 400 else EXIT_COULD_NOT_RUN) from None
        except Exception as exc:  # noqa: BLE001 - any start failure: a clear line, not a traceback
            typer.echo(f"tapdeck rollout: could not start a local server: {exc}", err=True)
            raise typer.Exit(EXIT_COULD_NOT_RUN) from None
        with _server_logs_to(log):
            try:
                shared = local.embedded_engine
                engine_gone = None
                if shared is not None and shared.owned:
                    typer.echo(f"started the embedded engine at {shared.base_url}", err=True)
                elif shared is not None:
                    typer.echo(shared.reuse_line(), err=True)
                    engine_gone = _engine_watch(shared)
                elif local.engine_url is not None:
                    typer.echo(f"engine {local.engine_url}", err=True)
                typer.echo(f"server log: {log}", err=True)
                code = _drive(local.url, local.admin_key, plan, resume, tiny_engine=url_engine is None,
                              resume_hint=_local_resume_hint(data, url_engine, engine_model),
                              engine_gone=engine_gone)
            finally:
                local.stop()
        raise typer.Exit(code)


def _check_local_run(data: Path, run_id: str) -> RunSummary:
    """The run to resume (its stored plan, the engine it used); exits before a server and engine
    are started for nothing: 1 when the run is not in `data` or its plan.json cannot be read
    back, 0 when every rollout of it ran to its end."""
    from tapdeck.runner.batch import BatchRunner
    from tapdeck.runner.errors import RunElsewhere, RunUnreadable
    from tapdeck.runner.run_dir import PLAN
    from tapdeck.runner.run_lock import RunLock

    if not (data / "runs" / run_id / PLAN).is_file():
        typer.echo(f"tapdeck rollout: no run {run_id} in {data / 'runs'} (pass the --data-dir it "
                   "ran in)", err=True)
        raise typer.Exit(EXIT_COULD_NOT_RUN)
    try:
        summary, rollouts = BatchRunner(None, data_dir=data, default_engine=None).get(run_id)
    except RunUnreadable as exc:
        typer.echo(f"tapdeck rollout: cannot resume run {run_id}: {exc}", err=True)
        raise typer.Exit(EXIT_COULD_NOT_RUN) from None
    if summary.state == "running":  # this process runs nothing yet: another one runs it
        pid = RunLock(data / "runs" / run_id).holder()
        typer.echo(f"tapdeck rollout: {RunElsewhere(run_id, pid or 0)}", err=True)
        raise typer.Exit(EXIT_COULD_NOT_RUN)
    if (done := _already_complete(RunDetail(**dict(summary), rollouts=rollouts))) is not None:
        typer.echo(done)
        raise typer.Exit(EXIT_OK)
    return summary


def _resumed_engine(ctx: typer.Context, run: RunSummary, url_engine: str | None,
                    engine_model: str | None) -> tuple[str | None, str | None]:
    """The engine (a URL, or None: the embedded one) and model a local resume of `run` starts
    its server with: the ones its rollouts called, which --engine/--engine-model may name again
    but not change (exit 2: the rollouts of one run must come from one engine). A run an older
    tapdeck wrote does not say which it called: the options decide, with a warning."""
    from tapdeck.proxy.upstream.address import shown_url
    from tapdeck.runner.engines import EMBEDDED

    used = run.engine_used
    if used is None:
        how = ("as --engine says" if url_engine is not None
               else "(give the --engine it was started with if it ran on another)")
        typer.echo(f"tapdeck rollout: warning: run {run.id} does not record the engine its "
                   f"rollouts called (an older tapdeck ran it); resuming on "
                   f"{_engine_words(url_engine)} {how}", err=True)
        return url_engine, engine_model
    used_url = None if used == EMBEDDED else used
    model_used = run.plan.rollout.engine_model or run.engine_model_used
    if _given(ctx, "engine") and not _same_engine(url_engine, used_url):
        given = shown_url(ctx.params["engine"])
        typer.echo(f"tapdeck rollout: run {run.id}'s rollouts called {_engine_words(used_url)}, "
                   f"not --engine {given}, and the rollouts of one run must come from one engine: "
                   f"drop --engine to resume on the engine it used, or start a new run with "
                   f"--engine {given}", err=True)
        raise typer.Exit(EXIT_USAGE)
    if engine_model is not None and model_used is not None and engine_model != model_used:
        typer.echo(f"tapdeck rollout: run {run.id}'s rollouts called model {model_used!r}, not "
                   f"--engine-model {engine_model!r}, and the rollouts of one run must come from "
                   "one model: drop --engine-model to resume on the one it used, or start a new "
                   "run with it", err=True)
        raise typer.Exit(EXIT_USAGE)
    if used_url is None:
        return None, engine_model
    if url_engine is None:
        typer.echo(f"resuming on the engine the run used: {shown_url(used_url)}", err=True)
    return used_url, engine_model or model_used


def _same_engine(given: str | None, used: str | None) -> bool:
    """Whether the engine address `given` (None: the embedded engine) names the engine a run
    recorded as `used`, the base URL it settled to (`HOST:PORT` names `http://HOST:PORT/v1`)."""
    from tapdeck.runner.engines import EngineChoiceError, normalize_engine_url

    if given is None or used is None:
        return given is used
    try:
        return normalize_engine_url(given) in (used, used.removesuffix("/v1"))
    except EngineChoiceError:  # not an address at all: not the one the run called
        return False


def _engine_words(url: str | None) -> str:
    """An engine as a message names it: `the embedded engine`, or its URL (no credentials)."""
    from tapdeck.proxy.upstream.address import shown_url

    return "the embedded engine" if url is None else f"the engine at {shown_url(url)}"


def _already_complete(run: RunDetail) -> str | None:
    """The line saying that resuming `run` has nothing to run, every rollout of it having run to
    its end; None when a resume would run some rollout, or the run is still going."""
    if run.state == "running" or any(runs_again_on_resume(r) for r in run.rollouts):
        return None
    c = run.counts
    return (f"run {run.id} is already complete: {c.total} rollout{'s' if c.total != 1 else ''}, "
            f"{c.ok} ok, {c.failed} failed; nothing to resume (results: {run.path})")


def _drive_remote(server: str, admin_key: str | None, data: Path, plan: RunPlan,
                  resume: str | None, ca_file: Path | None) -> None:
    """Submit to (or resume on) the server at `server` and follow the run; exits."""
    from tapdeck.app.client import command_admin_key
    from tapdeck.schema.addresses import http_base_url
    from tapdeck.schema.tls import server_trust

    try:
        base = http_base_url(server, "--server")
        key = command_admin_key(admin_key, data)
        trust = server_trust(ca_file)
    except ValueError as exc:
        typer.echo(f"tapdeck rollout: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    if key is None:
        typer.echo(f"tapdeck rollout: {admin_key_refusal(data, found=False)}", err=True)
        raise typer.Exit(EXIT_COULD_NOT_RUN)
    hint = f"--server {base}" + (f" --ca-file {ca_file}" if ca_file else "")
    raise typer.Exit(_drive(base, key, plan, resume, resume_hint=hint,
                            key_dir=None if admin_key else data, say_engine=True, verify=trust))


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a job scheduler, `timeout`, `kill`) stops the run as Ctrl-C does: cancelled,
    sandboxes torn down, the table printed. Without it the command died at once, leaving a run on
    a `--server` going and a local run recorded as running."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _finite(value: float | None) -> float | None:
    """A number option that is given must be finite (`inf` and `nan` would pass as floats)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter("must be a finite number")
    return value


def _plan_options_given(ctx: typer.Context, *, local: bool) -> list[str]:
    """The plan options given on the command line or by the environment, as their flags (a
    local run's engine options are not plan options: they start its server's engine)."""
    skipped = NOT_PLAN_OPTIONS | (LOCAL_ENGINE_OPTIONS if local else frozenset())
    return _flags_given(ctx, {p.name for p in ctx.command.params if p.name} - skipped)


def _flags_given(ctx: typer.Context, names: set[str] | frozenset[str]) -> list[str]:
    """Those of the options `names` given on the command line or by the environment, as their
    flags, in the command's order."""
    return ["/".join(p.opts) for p in ctx.command.params
            if p.name in names and _given(ctx, p.name)]


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the option was given on the command line or by the environment (not defaulted)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def _local_resume_hint(data: Path, url_engine: str | None, engine_model: str | None) -> str:
    """What `tapdeck rollout --resume RUN` needs to find a local run and its engine again."""
    import shlex

    hint = f"--data-dir {shlex.quote(str(data))}"
    if url_engine is not None:
        hint += f" --engine {shlex.quote(url_engine)}"
    if engine_model is not None:
        hint += f" --engine-model {shlex.quote(engine_model)}"
    return hint


@contextlib.contextmanager
def _server_logs_to(path: Path) -> Iterator[None]:
    """While the in-process server runs, its log lines (its access log, runner warnings, LiteLLM's
    notices) go to `path`: stderr keeps the progress line and this command's own messages."""
    import logging

    from litellm._logging import verbose_logger, verbose_proxy_logger, verbose_router_logger

    from tapdeck.proxy.store.no_follow import open_append

    handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    handler.setStream(open_append(path))  # never through a link (proxy/store/no_follow.py)
    handler.setLevel(logging.INFO)  # Harbor's DEBUG lines would bury the access log
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    litellm = [(lg, lg.handlers, lg.propagate)
               for lg in (verbose_logger, verbose_proxy_logger, verbose_router_logger)]
    root = logging.getLogger()
    root.addHandler(handler)
    # The access log's answered calls are INFO lines, under the root logger's WARNING otherwise
    # (a more verbose level someone set is kept).
    tapdeck = logging.getLogger("tapdeck")
    tapdeck_level = tapdeck.level
    tapdeck.setLevel(min(tapdeck.getEffectiveLevel(), logging.INFO))
    for lg, _, _ in litellm:
        lg.handlers, lg.propagate = [handler], False
    try:
        yield
    finally:
        root.removeHandler(handler)
        tapdeck.setLevel(tapdeck_level)
        for lg, handlers, propagate in litellm:
            lg.handlers, lg.propagate = handlers, propagate
        handler.close()


def _engine_watch(shared: SharedEngine) -> Callable[[], str | None]:
    """What the follow loop asks after each poll: why the reused embedded engine is gone, if it is."""

    def gone() -> str | None:
        why = shared.gone()
        if why is None:
            return None
        return (f"the embedded engine served by pid {shared.owner_pid} at {shared.base_url} went "
                f"away mid-run ({why})")

    return gone


def _settings(*, harness_kwargs: str | None, **fields: Any) -> dict[str, Any]:
    """The plan's `settings`: the flags given (the server fills in and checks the rest)."""
    import json

    settings = {k: v for k, v in fields.items() if v is not None}
    if harness_kwargs is not None:
        try:
            parsed = json.loads(harness_kwargs)
        except ValueError as exc:
            raise typer.BadParameter(f"not JSON: {exc}", param_hint="--harness-kwargs") from None
        if not isinstance(parsed, dict):
            raise typer.BadParameter("must be a JSON object", param_hint="--harness-kwargs")
        settings["harness_kwargs"] = parsed
    return settings


def _install_agent(harness: str) -> None:
    """An agent CLI tapdeck installs is installed here first, with progress (once)."""
    from tapdeck.runner.agent_install import PACKAGES

    if harness in PACKAGES:
        from tapdeck.app.commands.harness import install_with_progress

        install_with_progress([harness])


class ServerGone(Exception):
    """The server did not answer for SERVER_GRACE_S while the run was followed."""


class EngineGone(Exception):
    """The reused embedded engine went away mid-run; the message says whose and why."""


class NothingToResume(Exception):
    """The run to resume had every rollout run to its end; the message says so."""


def _drive(base: str, key: str | None, plan: RunPlan, resume: str | None, *,
           resume_hint: str, tiny_engine: bool = False,
           engine_gone: Callable[[], str | None] | None = None, key_dir: Path | None = None,
           say_engine: bool = False, verify: ssl.SSLContext | bool = True) -> int:
    """Submit (or resume) the run, follow it until it ends, print the table; the exit code.

    `resume_hint` is what `tapdeck rollout --resume RUN` needs to find the run again; `key_dir`
    is where a key the server rejects was looked for (a server of another process);
    `say_engine`: say which engine a resume runs on (a local one said it before it started);
    `verify`: what an https server's certificate is checked against."""
    try:
        summary = asyncio.run(_submit(base, key, plan, resume, say_engine=say_engine, verify=verify))
    except NothingToResume as exc:
        typer.echo(str(exc))
        return EXIT_OK
    except ApiError as exc:
        message = (f"no run {resume} on the server at {base}" if resume and exc.kind == "not_found"
                   else exc.for_command(key_dir, key_found=key is not None))
        typer.echo(f"tapdeck rollout: {message}", err=True)
        # A refused plan is bad usage; a refused resume is a run that cannot be run again, and a
        # dataset source that did not answer is a server-side error (502).
        return EXIT_USAGE if exc.kind == "rejected" and resume is None else EXIT_COULD_NOT_RUN
    run_id = summary.id
    typer.echo(f"run {run_id}", err=True)
    if resume is None:
        for line in summary.left_out:
            typer.echo(f"tapdeck rollout: warning: {line}; task left out", err=True)
    groups = summary.counts.total // max(summary.plan.k, 1)
    if resume is None and plan.n_tasks is not None and groups < plan.n_tasks:
        typer.echo(f"the dataset has {groups} task{'s' if groups != 1 else ''}: running "
                   f"{groups}, not the {plan.n_tasks} asked (-n)", err=True)
    resume_command = f"tapdeck rollout --resume {run_id} {resume_hint}"
    try:
        with _terminate_as_interrupt():
            doc = asyncio.run(_follow(base, key, run_id, engine_gone=engine_gone, verify=verify))
    except KeyboardInterrupt:
        typer.echo("cancelling (tearing sandboxes down)…", err=True)
        doc = asyncio.run(_follow(base, key, run_id, cancel=True, verify=verify))
    except ServerGone as exc:
        typer.echo(f"tapdeck rollout: the server at {base} went away ({exc}); the run may still be "
                   f"going there: follow it, or resume it once the server is back, with "
                   f"`{resume_command}`", err=True)
        return EXIT_COULD_NOT_RUN
    except EngineGone as exc:
        typer.echo(f"tapdeck rollout: {exc}; cancelling the run…", err=True)
        doc = asyncio.run(_follow(base, key, run_id, cancel=True, verify=verify))
        print_run_table(doc)
        typer.echo(f"tapdeck rollout: the run was cancelled: `{resume_command}` runs the rollouts "
                   "it stopped again (on an engine that answers)", err=True)
        return EXIT_COULD_NOT_RUN
    except ApiError as exc:
        typer.echo(f"tapdeck rollout: {exc.message}", err=True)
        return EXIT_COULD_NOT_RUN
    print_run_table(doc, tiny_engine)
    if doc.state == "finished" and doc.counts.failed == 0:
        return EXIT_OK
    if (why := _engine_failure(doc, resume_command, engine_gone)) is not None:
        typer.echo(f"tapdeck rollout: {why}", err=True)
        return EXIT_COULD_NOT_RUN
    return EXIT_ROLLOUT_FAILED


def _engine_failure(doc: RunDetail, resume_command: str,
                    engine_gone: Callable[[], str | None] | None) -> str | None:
    """Why an ended run counts as not run (exit 1) rather than as rollouts that failed: its
    rollouts saw the reused engine go before a poll did, or none of them reached the engine."""
    unreachable = sum(r.error_kind == "engine_unreachable" for r in doc.rollouts)
    rerun = f"`{resume_command}` runs them again (on an engine that answers)"
    # The run then ended on its own, without the cancel a poll that noticed first would send.
    if unreachable and engine_gone is not None and (why := engine_gone()):
        return f"{why}: {unreachable} rollout(s) ended engine_unreachable; {rerun}"
    if doc.rollouts and unreachable == len(doc.rollouts):
        # Nothing ran: the same as a local engine that does not answer at start.
        return f"no rollout reached the engine: {doc.rollouts[0].error}; {rerun}"
    return None


async def _submit(base: str, key: str | None, plan: RunPlan, resume: str | None, *,
                  say_engine: bool = False, verify: ssl.SSLContext | bool = True) -> RunSummary:
    """Start the plan's run, or resume run `resume` (follow it when it is running; raise
    NothingToResume, resuming nothing, when every rollout of it ran to its end). `say_engine`:
    say which engine the server resumes it on."""
    client = TapdeckClient(base, key, timeout=30.0, verify=verify)
    try:
        if resume is None:
            return await client.start_run(plan)
        try:
            run = await client.run(resume)
        except ApiError:
            run = None  # the resume below fails too, and its refusal says why
        if run is not None and (done := _already_complete(run)) is not None:
            raise NothingToResume(done)
        try:
            resumed = await client.resume_run(resume)
            if run is not None and say_engine:
                _say_engine_of_remote_resume(run)
            return resumed
        except ApiError as exc:
            if exc.status != 409:
                raise
            try:
                run = await client.run(resume)
            except ApiError:  # the run cannot be read either: the resume's refusal says why
                raise exc from None
            if run.state != "running":  # refused for its results, which that server cannot read
                raise
            typer.echo(f"run {resume} is running already: following it", err=True)
            return run
    finally:
        await client.aclose()


def _say_engine_of_remote_resume(run: RunSummary) -> None:
    """The line saying which engine a server resumes `run` on: the one it recorded (the server
    calls it again), or a warning that an older tapdeck recorded none."""
    from tapdeck.proxy.upstream.address import shown_url
    from tapdeck.runner.engines import EMBEDDED

    if not calls_a_model(run.plan.rollout.harness):
        return
    if run.engine_used is None:
        typer.echo(f"tapdeck rollout: warning: run {run.id} does not record the engine its "
                   "rollouts called (an older tapdeck ran it); the server resumes it on its own "
                   "engine", err=True)
    elif run.engine_used != EMBEDDED:
        typer.echo(f"resuming on the engine the run used: {shown_url(run.engine_used)}", err=True)


class _Backoff:
    """Pauses between tries at a server that does not answer: RETRY_FIRST_S, doubling up to
    RETRY_MAX_S; ServerGone once it has not answered for SERVER_GRACE_S."""

    def __init__(self) -> None:
        self.silent_since: float | None = None
        self.pause = RETRY_FIRST_S

    def next_pause(self, exc: ApiError) -> float:
        now = time.monotonic()
        if self.silent_since is None:
            self.silent_since = now
        elif now - self.silent_since >= SERVER_GRACE_S:
            raise ServerGone(f"no answer for {now - self.silent_since:.0f} s; last: {exc.message}")
        pause, self.pause = self.pause, min(self.pause * 2, RETRY_MAX_S)
        return pause

    def answered(self) -> None:
        self.silent_since, self.pause = None, RETRY_FIRST_S


async def _follow(base: str, key: str | None, run_id: str, *, cancel: bool = False,
                  engine_gone: Callable[[], str | None] | None = None,
                  verify: ssl.SSLContext | bool = True) -> RunDetail:
    """Poll the run, showing a one-line progress status, until it is no longer running.

    Raises ServerGone when the server stops answering for good, EngineGone when `engine_gone`
    (asked after each poll) says why the engine went away."""
    from rich.console import Console

    console = Console(stderr=True)
    client = TapdeckClient(base, key, timeout=30.0, verify=verify)
    backoff = _Backoff()
    try:
        if cancel:
            await client.cancel_run(run_id)
        with console.status("") as status:
            while True:
                try:
                    doc = await client.run(run_id)
                except ApiError as exc:
                    if exc.kind != "unreachable":
                        raise
                    pause = backoff.next_pause(exc)
                    status.update(f"the server does not answer; trying again in {pause:g} s…")
                    await asyncio.sleep(pause)
                    continue
                backoff.answered()
                status.update(_status_line(doc))
                if doc.state != "running":
                    return doc
                if engine_gone is not None and (why := await asyncio.to_thread(engine_gone)):
                    raise EngineGone(why)
                await asyncio.sleep(POLL_S)
    finally:
        await client.aclose()


def _status_line(doc: RunDetail) -> str:
    c = doc.counts
    phases = Counter(r.phase for r in doc.rollouts if r.phase not in ("done", "failed", "queued"))
    live = ", ".join(f"{n} {p}" for p, n in sorted(phases.items()))
    return (f"{c.done}/{c.total} done · {c.ok} ok · {c.failed} failed"
            + (f" · {live}" if live else ""))


def _refusal(exc: ValidationError) -> str:
    """A refused plan: each field named, as `settings.max_turns: ...`."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
