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
growing pause, and after run_follow.SERVER_GRACE_S of silence the command gives up (exit 1) saying
how to follow or resume the run. A local run on an embedded engine reused from another process is
cancelled (exit 1) when that engine goes away, rather than failing every call against it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from pydantic import ValidationError

from tapdeck.app.client import admin_key_refusal
from tapdeck.app.commands.options import (
    AdminKeyOption,
    DataDirOption,
    EngineModelOption,
    EngineWaitOption,
    PublicUrlOption,
    ServerCaFileOption,
    engine_option,
    server_option,
)
from tapdeck.app.commands.run_follow import already_complete, drive, engine_watch
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_OK, EXIT_USAGE, CommandError
from tapdeck.proxy.config import DEFAULT_ENGINE_WAIT_S
from tapdeck.runner.harnesses import calls_a_model
from tapdeck.runner.rollout_settings import (
    DEFAULT_HARD_LIMIT_S,
    DEFAULT_MAX_TURNS,
    HARD_LIMIT_MARGIN_S,
    PROMPT_SHARE,
    harness_defaults,
)
from tapdeck.schema.rollout_health import DEFAULT_MIN_LOSS_MASK_FRACTION
from tapdeck.schema.runs import RolloutTemplate, RunDetail, RunPlan, RunSummary

NOT_PLAN_OPTIONS = frozenset({"data_dir", "server", "admin_key", "ca_file", "resume", "engine_wait"})
"""Options that say where the run is; every other one shapes a new run's plan."""
LOCAL_ENGINE_OPTIONS = frozenset({"engine", "engine_model"})
"""Without --server these pick the local server's engine, which a resumed run uses again."""
SETTINGS_PANEL = "Rollout settings (unset: the default shown; bad values refused, field named)"
EXIT_CODES_HELP = (
    "Exit codes: 0 every rollout ok (or, with --resume, none left to run); 1 the run could not be "
    "run (server, engine or dataset source not answering); 2 bad usage (unknown option, options "
    "that conflict, or a plan the server refused); 3 the run ended with some rollout not ok (failed "
    "or cancelled; the table says why)."
)


def register(app: typer.Typer) -> None:
    """Add the `rollout` command."""

    @app.command("rollout", epilog=EXIT_CODES_HELP)
    def rollout(
        ctx: typer.Context,
        dataset: str | None = typer.Option(
            None,
            "--dataset",
            help="Dataset: a local folder, a Harbor registry name, a git URL (default: the sample dataset).",
        ),
        task: list[str] | None = typer.Option(
            None, "--task", help="Task name (repeatable; default: the first -n tasks)."
        ),
        harness: str = typer.Option("terminus-2", "--harness", help="Agent harness."),
        sandbox: str = typer.Option("host", "--sandbox", help="Sandbox: host or a Harbor backend."),
        engine: Annotated[
            str, engine_option("`embedded`, or an engine: HOST:PORT, http://HOST:PORT or …/v1.")
        ] = "embedded",
        engine_model: EngineModelOption = None,
        engine_wait: EngineWaitOption = DEFAULT_ENGINE_WAIT_S,
        n_tasks: int = typer.Option(1, "-n", "--tasks", min=1, help="How many tasks (N)."),
        k: int = typer.Option(1, "-k", "--rollouts", min=1, help="Rollouts per task (GRPO group size)."),
        concurrency: int = typer.Option(1, "-c", "--concurrency", min=1, help="Rollouts at once."),
        reward_key: str | None = typer.Option(
            None, "--reward-key", help="Which verifier reward to use when there are several."
        ),
        timeout: float | None = typer.Option(
            None,
            "--timeout",
            callback=_finite,
            help=f"Hard limit per rollout, seconds (default "
            f"{DEFAULT_HARD_LIMIT_S:g}, or the agent timeout + {HARD_LIMIT_MARGIN_S:g} where longer).",
            rich_help_panel=SETTINGS_PANEL,
        ),
        agent_timeout: float | None = typer.Option(
            None,
            "--agent-timeout",
            callback=_finite,
            help="The agent phase's limit, seconds (default: the task's "
            "agent.timeout_sec in task.toml, none if it has none; on the embedded engine at least "
            f"the harness's: {_per_harness('agent_timeout_s')}).",
            rich_help_panel=SETTINGS_PANEL,
        ),
        max_turns: int | None = typer.Option(
            None,
            "--max-turns",
            help=f"Turn/step limit of the harness (default {DEFAULT_MAX_TURNS}).",
            rich_help_panel=SETTINGS_PANEL,
        ),
        max_output_tokens: int | None = typer.Option(
            None,
            "--max-output-tokens",
            help="Output tokens per model call (default: on a served "
            "model none of tapdeck's, the harness's own request; on the embedded engine "
            f"{_per_harness('output_tokens')}; at most 1/{PROMPT_SHARE} of the context).",
            rich_help_panel=SETTINGS_PANEL,
        ),
        context_tokens: int | None = typer.Option(
            None,
            "--context-tokens",
            help="Context the agent is told it has (default: the "
            "engine's max_model_len; more than that is refused).",
            rich_help_panel=SETTINGS_PANEL,
        ),
        temperature: float | None = typer.Option(
            None,
            "--temperature",
            callback=_finite,
            help="Sampling temperature (default: the harness's own; "
            "enforced on every call of a training-tier session).",
            rich_help_panel=SETTINGS_PANEL,
        ),
        top_p: float | None = typer.Option(
            None,
            "--top-p",
            callback=_finite,
            help="Truncation knob asked by terminus-2 (reset to its no-op at the training tier).",
            rich_help_panel=SETTINGS_PANEL,
        ),
        top_k: int | None = typer.Option(None, "--top-k", help="As --top-p.", rich_help_panel=SETTINGS_PANEL),
        min_p: float | None = typer.Option(
            None, "--min-p", callback=_finite, help="As --top-p.", rich_help_panel=SETTINGS_PANEL
        ),
        harness_kwargs: str | None = typer.Option(
            None,
            "--harness-kwargs",
            help="Keyword arguments passed verbatim to the Harbor agent, "
            "a JSON object (default: none; an agent CLI's tool_profile is full on a served model, "
            f"lean on the embedded engine: {_per_harness('tool_profile')}).",
            rich_help_panel=SETTINGS_PANEL,
        ),
        sandbox_kwargs: str | None = typer.Option(
            None,
            "--sandbox-kwargs",
            help="Keyword arguments for the sandbox, a JSON object (default: none), e.g. "
            '\'{"network": "host"}\': docker\'s network is auto, none, host or bridge, the host '
            "sandbox's auto, none or host (docs/rollouts.md).",
        ),
        alternatives: int = typer.Option(
            0,
            "--alternatives",
            min=0,
            max=20,
            help="Top alternatives per sampled token to capture for "
            "inspection (default: only what the harness asks for).",
        ),
        min_loss_mask_fraction: float | None = typer.Option(
            None,
            "--min-loss-mask-fraction",
            min=0.0,
            max=1.0,
            help="Grade a training rollout degenerate (trainers skip it) when a smaller share of "
            f"its agent's sampled tokens is in the loss (default {DEFAULT_MIN_LOSS_MASK_FRACTION:g}; "
            "one call or no trainable token is degenerate too).",
        ),
        data_dir: DataDirOption = None,
        server: Annotated[
            str | None, server_option("Submit to this tapdeck server instead of starting one here.")
        ] = None,
        admin_key: AdminKeyOption = None,
        ca_file: ServerCaFileOption = None,
        resume: str | None = typer.Option(
            None,
            "--resume",
            help="Resume an interrupted run by id "
            "(finished rollouts are not redone; it runs its stored "
            "plan on the engine it used, so plan options and "
            "another --engine are refused with it), or "
            "follow it if it is running.",
        ),
        token_in: bool | None = typer.Option(
            None,
            "--token-in/--no-token-in",
            help="Continue held conversations from their token ids (default: on for training rollouts).",
        ),
        engine_tool_parser: str | None = typer.Option(
            None,
            "--engine-tool-parser",
            help="The tool-call parser the engine runs (vLLM's "
            "--tool-call-parser, e.g. hermes): token-in continues calls with tools with it.",
        ),
        engine_reasoning_parser: str | None = typer.Option(
            None,
            "--engine-reasoning-parser",
            help="The reasoning parser the engine runs, if any: token-in then sends every call as text.",
        ),
        public_url: PublicUrlOption = None,
    ) -> None:
        """Run N tasks × K rollouts through the capture proxy and print the results."""
        from tapdeck.app.failures import validation_line
        from tapdeck.proxy.config import ServerConfig, default_data_dir
        from tapdeck.proxy.upstream.address import EngineAddressError
        from tapdeck.runner.run_dir import is_run_id

        data = (data_dir or default_data_dir()).expanduser()
        if resume is not None and not is_run_id(resume):
            raise CommandError(
                EXIT_USAGE,
                f"tapdeck rollout: --resume {resume!r} is not a run id: "
                "give the id a run was started with (run-…), not a path",
            )
        if resume is not None and (given := _plan_options_given(ctx, local=server is None)):
            raise CommandError(
                EXIT_USAGE,
                f"tapdeck rollout: --resume runs the run's stored plan, so "
                f"{', '.join(given)} would be ignored; drop them, or start a new run",
            )
        if server is not None and _given(ctx, "engine_wait"):
            raise CommandError(
                EXIT_USAGE,
                "tapdeck rollout: --engine-wait is how long a server started here waits for its "
                "engine; the server at --server waits for its own (tapdeck serve --engine-wait)",
            )
        if task and _given(ctx, "n_tasks"):
            raise CommandError(
                EXIT_USAGE,
                "tapdeck rollout: -n/--tasks picks the dataset's first N "
                "tasks, so with --task, which names them, it would be ignored; drop "
                "one of them",
            )
        try:
            plan = RunPlan(
                dataset=dataset,
                tasks=task or None,
                n_tasks=None if task else n_tasks,
                k=k,
                concurrency=concurrency,
                rollout=RolloutTemplate.model_validate(
                    dict(
                        # From a dict: the flags' settings are checked as the template's (`settings.*`).
                        harness=harness,
                        sandbox=sandbox,
                        sandbox_kwargs=_json_object(sandbox_kwargs, "--sandbox-kwargs"),
                        engine=engine,
                        engine_model=engine_model,
                        engine_tool_parser=engine_tool_parser,
                        engine_reasoning_parser=engine_reasoning_parser,
                        timeout_s=timeout,
                        reward_key=reward_key,
                        alternatives=alternatives,
                        public_url=public_url,
                        token_in=token_in,
                        min_loss_mask_fraction=min_loss_mask_fraction,
                        settings=_settings(
                            agent_timeout_s=agent_timeout,
                            max_turns=max_turns,
                            max_output_tokens=max_output_tokens,
                            context_tokens=context_tokens,
                            temperature=temperature,
                            top_p=top_p,
                            top_k=top_k,
                            min_p=min_p,
                            harness_kwargs=harness_kwargs,
                        ),
                    )
                ),
            )
        except ValidationError as exc:
            raise CommandError(EXIT_USAGE, f"tapdeck rollout: plan refused: {_refusal(exc)}") from None
        if server is not None:
            _drive_remote(server, admin_key, data, plan, resume, ca_file)
        url_engine = engine if engine.strip().lower() not in ("", "embedded", "default") else None
        try:
            config = ServerConfig(
                port=0,
                data_dir=data,
                engine_url=url_engine,
                engine_model=engine_model,
                engine_wait_s=engine_wait,
            )
        except ValidationError as exc:
            raise CommandError(EXIT_USAGE, f"tapdeck rollout: {validation_line(exc)}") from None
        if resume is not None:
            resumed = _check_local_run(data, resume)
            # A resumed run runs its stored plan: its harness, not the option's default, decides.
            harness = resumed.plan.rollout.harness
            if not calls_a_model(harness) and (given := _flags_given(ctx, LOCAL_ENGINE_OPTIONS)):
                # Its server starts no engine, so these would start nothing.
                raise CommandError(
                    EXIT_USAGE,
                    f"tapdeck rollout: --resume runs run {resume}'s "
                    f"stored plan, whose harness {harness} calls no model, so "
                    f"{', '.join(given)} would be ignored; drop them",
                )
            if calls_a_model(harness):
                url_engine, engine_model = _resumed_engine(ctx, resumed, url_engine, engine_model)
                config = config.model_copy(update={"engine_url": url_engine, "engine_model": engine_model})
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
            raise CommandError(
                EXIT_USAGE if exc.status == 400 else EXIT_COULD_NOT_RUN, f"tapdeck rollout: {exc}"
            ) from None
        except Exception as exc:  # noqa: BLE001 - any start failure: a clear line, not a traceback
            raise CommandError(
                EXIT_COULD_NOT_RUN, f"tapdeck rollout: could not start a local server: {exc}"
            ) from None
        with _server_logs_to(log):
            try:
                try:
                    local.wait_for_engine(lambda line: typer.echo(line, err=True))
                except EngineAddressError as exc:
                    raise CommandError(
                        EXIT_USAGE if exc.status == 400 else EXIT_COULD_NOT_RUN, f"tapdeck rollout: {exc}"
                    ) from None
                shared = local.embedded_engine
                engine_gone = None
                if shared is not None and shared.owned:
                    typer.echo(f"started the embedded engine at {shared.base_url}", err=True)
                elif shared is not None:
                    typer.echo(shared.reuse_line(), err=True)
                    engine_gone = engine_watch(shared)
                elif local.engine_url is not None:
                    typer.echo(f"engine {local.engine_url}", err=True)
                typer.echo(f"server log: {log}", err=True)
                code = drive(
                    local.url,
                    local.admin_key,
                    plan,
                    resume,
                    tiny_engine=url_engine is None,
                    resume_hint=_local_resume_hint(data, url_engine, engine_model),
                    engine_gone=engine_gone,
                )
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
        raise CommandError(
            EXIT_COULD_NOT_RUN,
            f"tapdeck rollout: no run {run_id} in {data / 'runs'} (pass the --data-dir it ran in)",
        )
    try:
        summary, rollouts = BatchRunner(None, data_dir=data, default_engine=None).get(run_id)
    except RunUnreadable as exc:
        raise CommandError(
            EXIT_COULD_NOT_RUN, f"tapdeck rollout: cannot resume run {run_id}: {exc}"
        ) from None
    if summary.state == "running":  # this process runs nothing yet: another one runs it
        pid = RunLock(data / "runs" / run_id).holder()
        raise CommandError(EXIT_COULD_NOT_RUN, f"tapdeck rollout: {RunElsewhere(run_id, pid or 0)}")
    if (done := already_complete(RunDetail(**dict(summary), rollouts=rollouts))) is not None:
        typer.echo(done)
        raise typer.Exit(EXIT_OK)
    return summary


def _resumed_engine(
    ctx: typer.Context, run: RunSummary, url_engine: str | None, engine_model: str | None
) -> tuple[str | None, str | None]:
    """The engine (a URL, or None: the embedded one) and model a local resume of `run` starts
    its server with: the ones its rollouts called, which --engine/--engine-model may name again
    but not change (exit 2: the rollouts of one run must come from one engine). A run an older
    tapdeck wrote does not say which it called: the options decide, with a warning."""
    from tapdeck.proxy.upstream.address import shown_url
    from tapdeck.runner.engines import EMBEDDED

    used = run.engine_used
    if used is None:
        how = (
            "as --engine says"
            if url_engine is not None
            else "(give the --engine it was started with if it ran on another)"
        )
        typer.echo(
            f"tapdeck rollout: warning: run {run.id} does not record the engine its "
            f"rollouts called (an older tapdeck ran it); resuming on "
            f"{_engine_words(url_engine)} {how}",
            err=True,
        )
        return url_engine, engine_model
    used_url = None if used == EMBEDDED else used
    model_used = run.plan.rollout.engine_model or run.engine_model_used
    if _given(ctx, "engine") and not _same_engine(url_engine, used_url):
        given = shown_url(ctx.params["engine"])
        raise CommandError(
            EXIT_USAGE,
            f"tapdeck rollout: run {run.id}'s rollouts called "
            f"{_engine_words(used_url)}, not --engine {given}, and the rollouts of "
            "one run must come from one engine: drop --engine to resume on the "
            f"engine it used, or start a new run with --engine {given}",
        )
    if engine_model is not None and model_used is not None and engine_model != model_used:
        raise CommandError(
            EXIT_USAGE,
            f"tapdeck rollout: run {run.id}'s rollouts called model "
            f"{model_used!r}, not --engine-model {engine_model!r}, and the rollouts "
            "of one run must come from one model: drop --engine-model to resume on "
            "the one it used, or start a new run with it",
        )
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


def _drive_remote(
    server: str, admin_key: str | None, data: Path, plan: RunPlan, resume: str | None, ca_file: Path | None
) -> None:
    """Submit to (or resume on) the server at `server` and follow the run; exits."""
    from tapdeck.app.client import command_admin_key
    from tapdeck.schema.addresses import http_base_url
    from tapdeck.schema.tls import server_trust

    try:
        base = http_base_url(server, "--server")
        key = command_admin_key(admin_key, data)
        trust = server_trust(ca_file)
    except ValueError as exc:
        raise CommandError(EXIT_USAGE, f"tapdeck rollout: {exc}") from None
    if key is None:
        raise CommandError(EXIT_COULD_NOT_RUN, f"tapdeck rollout: {admin_key_refusal(data, found=False)}")
    hint = f"--server {base}" + (f" --ca-file {ca_file}" if ca_file else "")
    raise typer.Exit(
        drive(
            base,
            key,
            plan,
            resume,
            resume_hint=hint,
            key_dir=None if admin_key else data,
            say_engine=True,
            verify=trust,
        )
    )


def _finite(value: float | None) -> float | None:
    """A number option that is given must be finite (`inf` and `nan` would pass as floats)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter("must be a finite number")
    return value


def _per_harness(field: str) -> str:
    """One of the harnesses' defaults on the embedded engine, each named, for `--help`."""
    rows = harness_defaults()
    if field == "tool_profile":
        return ", ".join(r.harness for r in rows if r.tool_profile == "lean")
    if field == "output_tokens":
        return ", ".join(f"{r.harness} {r.output_tokens}" for r in rows)
    return ", ".join(f"{r.harness} {r.agent_timeout_s:g} s" for r in rows)


def _plan_options_given(ctx: typer.Context, *, local: bool) -> list[str]:
    """The plan options given on the command line or by the environment, as their flags (a
    local run's engine options are not plan options: they start its server's engine)."""
    skipped = NOT_PLAN_OPTIONS | (LOCAL_ENGINE_OPTIONS if local else frozenset())
    return _flags_given(ctx, {p.name for p in ctx.command.params if p.name} - skipped)


def _flags_given(ctx: typer.Context, names: set[str] | frozenset[str]) -> list[str]:
    """Those of the options `names` given on the command line or by the environment, as their
    flags, in the command's order."""
    return ["/".join(p.opts) for p in ctx.command.params if p.name in names and _given(ctx, p.name)]


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
    import io
    import logging

    from litellm._logging import verbose_logger, verbose_proxy_logger, verbose_router_logger

    from tapdeck.proxy.store.no_follow import open_append

    handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    # Never through a link (proxy/store/no_follow.py). Its TextIO is os.fdopen's TextIOWrapper, the
    # stream type FileHandler is declared with.
    handler.setStream(cast(io.TextIOWrapper, open_append(path)))
    handler.setLevel(logging.INFO)  # Harbor's DEBUG lines would bury the access log
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    litellm = [
        (lg, lg.handlers, lg.propagate)
        for lg in (verbose_logger, verbose_proxy_logger, verbose_router_logger)
    ]
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


def _settings(*, harness_kwargs: str | None, **fields: Any) -> dict[str, Any]:
    """The plan's `settings`: the flags given (the server fills in and checks the rest)."""
    settings = {k: v for k, v in fields.items() if v is not None}
    if harness_kwargs is not None:
        settings["harness_kwargs"] = _json_object(harness_kwargs, "--harness-kwargs")
    return settings


def _json_object(text: str | None, option: str) -> dict[str, Any] | None:
    """An option's JSON object (None when the option was not given)."""
    import json

    if text is None:
        return None
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint=option) from None
    if not isinstance(parsed, dict):
        raise typer.BadParameter("must be a JSON object", param_hint=option)
    return parsed


def _install_agent(harness: str) -> None:
    """An agent CLI tapdeck installs is installed here first, with progress (once)."""
    from tapdeck.runner.agent_install import PACKAGES

    if harness in PACKAGES:
        from tapdeck.app.commands.harness import install_with_progress

        install_with_progress([harness])


def _refusal(exc: ValidationError) -> str:
    """A refused plan: each field named, as `settings.max_turns: ...`."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
