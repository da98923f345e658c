"""`tapdeck rollout`: run a batch of rollouts headless and print one row per rollout.

With no flags it runs the sample dataset's first task once with terminus-2 on the host sandbox
against the embedded engine (offline, no key). Without `--server` it starts a tapdeck server in this
process on a free loopback port; with `--server URL` it submits the run to that server instead.
The small embedded model never solves tasks (reward 0): it exercises capture, not skill.

Exit codes (also in `--help` and the README): 0 every rollout ok; 1 the run could not be run (no
server, no engine answering, server error); 2 bad usage (an unknown option, or a plan the server
refused: unknown task, harness, sandbox or engine address); 3 the run ended with some rollout not
ok (failed, or cancelled).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from tapdeck.app.client import ApiError, TapdeckClient
from tapdeck.runner.rollout_settings import (
    DEFAULT_HARD_LIMIT_S,
    DEFAULT_MAX_TURNS,
    MIN_OUTPUT_TOKENS,
    OUTPUT_SHARE,
    PROMPT_SHARE,
)
from tapdeck.schema.runs import RolloutTemplate, RunDetail, RunPlan

POLL_S = 1.0
SETTINGS_PANEL = "Rollout settings (unset: the default shown; bad values refused, field named)"
EXIT_OK, EXIT_COULD_NOT_RUN, EXIT_USAGE, EXIT_ROLLOUT_FAILED = 0, 1, 2, 3
"""2 is also what the command line parser exits with for an unknown option or a bad value."""
EXIT_CODES_HELP = (
    "Exit codes: 0 every rollout ok; 1 the run could not be run (server or engine not "
    "answering); 2 bad usage (unknown option, or a plan the server refused); 3 the run ended with "
    "some rollout not ok (failed or cancelled; the table says why).")


def register(app: typer.Typer) -> None:
    """Add the `rollout` command."""

    @app.command("rollout", epilog=EXIT_CODES_HELP)
    def rollout(
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
            None, "--timeout", help=f"Hard limit per rollout, seconds (default "
            f"{DEFAULT_HARD_LIMIT_S:g}).", rich_help_panel=SETTINGS_PANEL),
        agent_timeout: float | None = typer.Option(
            None, "--agent-timeout", help="The agent phase's limit, seconds (default: the task's "
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
            None, "--temperature", help="Sampling temperature (default: the harness's own; "
            "enforced on every call of a training-tier session).", rich_help_panel=SETTINGS_PANEL),
        top_p: float | None = typer.Option(None, "--top-p", help="Truncation knob asked by "
                                           "terminus-2 (reset to its no-op at the training tier).",
                                           rich_help_panel=SETTINGS_PANEL),
        top_k: int | None = typer.Option(None, "--top-k", help="As --top-p.",
                                         rich_help_panel=SETTINGS_PANEL),
        min_p: float | None = typer.Option(None, "--min-p", help="As --top-p.",
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
        resume: str | None = typer.Option(None, "--resume", help="Resume an interrupted run by id "
                                          "(finished rollouts are not redone)."),
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
        import os

        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        from tapdeck.proxy.config import ServerConfig, default_data_dir, read_admin_key
        from tapdeck.proxy.engine_address import EngineAddressError

        data = (data_dir or default_data_dir()).expanduser()
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
        if server is None:
            _install_agent(harness)
        local = None
        url_engine = None
        if server is None:
            from tapdeck.app.host import LocalServer

            url_engine = engine if engine.strip().lower() not in ("", "embedded", "default") else None
            config = ServerConfig(port=0, data_dir=data, engine_url=url_engine, engine_model=engine_model)
            plan.rollout.engine = "embedded"  # the server's default engine is the one asked for
            typer.echo("starting a local tapdeck server"
                       + (" and the embedded engine…" if url_engine is None else "…"), err=True)
            try:
                local = LocalServer(config).start()
            except EngineAddressError as exc:
                typer.echo(f"tapdeck rollout: {exc}", err=True)
                raise typer.Exit(EXIT_USAGE if exc.status == 400 else EXIT_COULD_NOT_RUN) from None
            except Exception as exc:  # a clear line, not a traceback
                typer.echo(f"tapdeck rollout: could not start a local server: {exc}", err=True)
                raise typer.Exit(EXIT_COULD_NOT_RUN) from None
            base, key = local.url, local.admin_key
            if url_engine is not None:
                typer.echo(f"engine {local.engine_url}", err=True)
        else:
            base, key = server.rstrip("/"), admin_key or read_admin_key(data)
        try:
            code = _drive(base, key, plan, resume, tiny_engine=local is not None and url_engine is None)
        finally:
            if local is not None:
                local.stop()
        raise typer.Exit(code)


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


def _drive(base: str, key: str | None, plan: RunPlan, resume: str | None,
           tiny_engine: bool = False) -> int:
    """Submit (or resume) the run, follow it until it ends, print the table; the exit code."""
    try:
        run_id = asyncio.run(_submit(base, key, plan, resume))
    except ApiError as exc:
        typer.echo(f"tapdeck rollout: {exc.message}", err=True)
        return EXIT_USAGE if exc.kind in ("rejected", "not_found") else EXIT_COULD_NOT_RUN
    typer.echo(f"run {run_id}", err=True)
    try:
        doc = asyncio.run(_follow(base, key, run_id))
    except KeyboardInterrupt:
        typer.echo("cancelling (tearing sandboxes down)…", err=True)
        doc = asyncio.run(_follow(base, key, run_id, cancel=True))
    except ApiError as exc:
        typer.echo(f"tapdeck rollout: {exc.message}", err=True)
        return EXIT_COULD_NOT_RUN
    _print_table(doc, tiny_engine)
    if doc.state == "finished" and doc.counts.failed == 0:
        return EXIT_OK
    return EXIT_ROLLOUT_FAILED


async def _submit(base: str, key: str | None, plan: RunPlan, resume: str | None) -> str:
    client = TapdeckClient(base, key, timeout=30.0)
    try:
        run = await (client.resume_run(resume) if resume else client.start_run(plan))
    finally:
        await client.aclose()
    return run.id


async def _follow(base: str, key: str | None, run_id: str, *, cancel: bool = False) -> RunDetail:
    """Poll the run, showing a one-line progress status, until it is no longer running."""
    from rich.console import Console

    console = Console(stderr=True)
    client = TapdeckClient(base, key, timeout=30.0)
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
                    # A loaded machine can stall the server for a while.
                    status.update("waiting for the server to answer…")
                    continue
                status.update(_status_line(doc))
                if doc.state != "running":
                    return doc
                await asyncio.sleep(POLL_S)
    finally:
        await client.aclose()


def _status_line(doc: RunDetail) -> str:
    c = doc.counts
    phases = Counter(r.phase for r in doc.rollouts if r.phase not in ("done", "failed", "queued"))
    live = ", ".join(f"{n} {p}" for p, n in sorted(phases.items()))
    return (f"{c.done}/{c.total} done · {c.ok} ok · {c.failed} failed"
            + (f" · {live}" if live else ""))


def _print_table(doc: RunDetail, tiny_engine: bool = False) -> None:
    """One row per rollout (task, group, reward, ok, turns, atif, error), at most 80 columns."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=min(80, Console().width))
    table = Table(box=None, pad_edge=False, expand=False, show_edge=False)
    table.add_column("task", no_wrap=True, overflow="ellipsis", max_width=20)
    table.add_column("grp", justify="right", width=3)
    table.add_column("reward", justify="right", width=6)
    table.add_column("ok", width=3)
    table.add_column("turns", justify="right", width=5)
    table.add_column("atif", width=8)
    table.add_column("error", no_wrap=True, overflow="ellipsis", max_width=26)
    for r in doc.rollouts:
        reward = "-" if r.reward is None else f"{r.reward:.2f}"
        ok = "yes" if r.ok else ("…" if r.phase not in ("done", "failed") else "no")
        table.add_row(r.task, str(r.group), reward, ok, str(r.turns), r.atif, r.error_kind or "")
    console.print(table)
    c = doc.counts
    mean = "-" if doc.mean_reward is None else f"{doc.mean_reward:.3f}"
    rate = "-" if doc.pass_rate is None else f"{doc.pass_rate:.0%}"
    console.print(f"run {doc.id} {doc.state}: {c.done}/{c.total} done, {c.ok} ok, {c.failed} failed")
    console.print(f"mean reward {mean} (graded only) · pass rate {rate} (full reward, graded only)")
    if doc.failures:
        console.print("failures: " + ", ".join(f"{k} {v}" for k, v in sorted(doc.failures.items())))
    for line in sorted({r.settings.line() for r in doc.rollouts if r.settings is not None}):
        console.print(f"ran with: {line}")
    console.print(f"results: {doc.path}")
    if tiny_engine and doc.plan.rollout.harness not in ("oracle", "nop"):
        console.print("note: the embedded model (SmolLM2-135M) exercises capture but never solves "
                      "tasks (reward 0); use --engine URL for a real model")


def _refusal(exc: ValidationError) -> str:
    """A refused plan: each field named, as `settings.max_turns: ...`."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
