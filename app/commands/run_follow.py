"""Submit a `tapdeck rollout` run to a tapdeck server (or resume one there), follow it to its
end and print its table; the command's exit code from how it ended.

Following polls the server. A server that stops answering is tried again with a growing pause;
after SERVER_GRACE_S of silence it is given up on (exit 1), with the command that follows or
resumes the run. A local run on an embedded engine reused from another process is cancelled
(exit 1) when that engine goes away. SIGTERM cancels the run as Ctrl-C does.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from tapdeck.app.client import ApiError, TapdeckClient
from tapdeck.app.commands.run_table import print_run_table
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_OK, EXIT_ROLLOUT_FAILED, EXIT_USAGE
from tapdeck.runner.engines import is_embedded
from tapdeck.runner.harnesses import calls_a_model
from tapdeck.schema.runs import RunDetail, RunPlan, RunSummary, runs_again_on_resume

if TYPE_CHECKING:
    from tapdeck.runner.engine.registry import SharedEngine

POLL_S = 1.0
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 5.0
"""Pause before the first retry at a server that does not answer, doubling up to the most."""
SERVER_GRACE_S = 60.0
"""How long a server may not answer before the command gives up following the run (a loaded
machine can stall a server for a while; a dead one never comes back)."""


def engine_watch(shared: SharedEngine) -> Callable[[], str | None]:
    """What the follow loop asks after each poll: why the reused embedded engine is gone, if it is."""

    def gone() -> str | None:
        why = shared.gone()
        if why is None:
            return None
        return (
            f"the embedded engine served by pid {shared.owner_pid} at {shared.base_url} went "
            f"away mid-run ({why})"
        )

    return gone


def already_complete(run: RunDetail) -> str | None:
    """The line saying that resuming `run` has nothing to run, every rollout of it having run to
    its end; None when a resume would run some rollout, or the run is still going."""
    if run.state == "running" or any(runs_again_on_resume(r) for r in run.rollouts):
        return None
    c = run.counts
    return (
        f"run {run.id} is already complete: {c.total} rollout{'s' if c.total != 1 else ''}, "
        f"{c.ok} ok, {c.failed} failed; nothing to resume (results: {run.path})"
    )


class ServerGone(Exception):
    """The server did not answer for SERVER_GRACE_S while the run was followed."""


class EngineGone(Exception):
    """The reused embedded engine went away mid-run; the message says whose and why."""


class NothingToResume(Exception):
    """The run to resume had every rollout run to its end; the message says so."""


def drive(
    base: str,
    key: str | None,
    plan: RunPlan,
    resume: str | None,
    *,
    resume_hint: str,
    tiny_engine: bool = False,
    engine_gone: Callable[[], str | None] | None = None,
    key_dir: Path | None = None,
    say_engine: bool = False,
    verify: ssl.SSLContext | bool = True,
) -> int:
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
        message = (
            f"no run {resume} on the server at {base}"
            if resume and exc.kind == "not_found"
            else exc.for_command(key_dir, key_found=key is not None)
        )
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
        typer.echo(
            f"the dataset has {groups} task{'s' if groups != 1 else ''}: running "
            f"{groups}, not the {plan.n_tasks} asked (-n)",
            err=True,
        )
    resume_command = f"tapdeck rollout --resume {run_id} {resume_hint}"
    try:
        with _terminate_as_interrupt():
            doc = asyncio.run(_follow(base, key, run_id, engine_gone=engine_gone, verify=verify))
    except KeyboardInterrupt:
        typer.echo("cancelling (tearing sandboxes down)…", err=True)
        doc = asyncio.run(_follow(base, key, run_id, cancel=True, verify=verify))
    except ServerGone as exc:
        typer.echo(
            f"tapdeck rollout: the server at {base} went away ({exc}); the run may still be "
            f"going there: follow it, or resume it once the server is back, with "
            f"`{resume_command}`",
            err=True,
        )
        return EXIT_COULD_NOT_RUN
    except EngineGone as exc:
        typer.echo(f"tapdeck rollout: {exc}; cancelling the run…", err=True)
        doc = asyncio.run(_follow(base, key, run_id, cancel=True, verify=verify))
        print_run_table(doc)
        typer.echo(
            f"tapdeck rollout: the run was cancelled: `{resume_command}` runs the rollouts "
            "it stopped again (on an engine that answers)",
            err=True,
        )
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


def _engine_failure(
    doc: RunDetail, resume_command: str, engine_gone: Callable[[], str | None] | None
) -> str | None:
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


async def _submit(
    base: str,
    key: str | None,
    plan: RunPlan,
    resume: str | None,
    *,
    say_engine: bool = False,
    verify: ssl.SSLContext | bool = True,
) -> RunSummary:
    """Start the plan's run, or resume run `resume` (follow it when it is running; raise
    NothingToResume, resuming nothing, when every rollout of it ran to its end). `say_engine`:
    say which engine the server resumes it on."""
    client = TapdeckClient(base, key, timeout=30.0, verify=verify)
    try:
        if resume is None:
            await _await_servers_engine_for(client, plan)
            return await client.start_run(plan)
        try:
            run = await client.run(resume)
        except ApiError:
            run = None  # the resume below fails too, and its refusal says why
        if run is not None and (done := already_complete(run)) is not None:
            raise NothingToResume(done)
        if run is not None:
            await _await_servers_engine_for(client, run.plan)
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


async def _await_servers_engine_for(client: TapdeckClient, plan: RunPlan) -> None:
    """Wait with the server for its default engine when `plan`'s rollouts call it: the server
    refuses such a run with a 503 until it answers."""
    if is_embedded(plan.rollout.engine) and calls_a_model(plan.rollout.harness):
        await await_servers_engine(client, lambda line: typer.echo(line, err=True))


async def await_servers_engine(
    client: TapdeckClient, say: Callable[[str], None], *, every_s: float | None = None
) -> None:
    """Wait while the server waits for its default engine (its `/health` says so), saying
    "waiting for the engine at URL (N s)" every `every_s` (default: as `serve` does): a run on that
    engine submitted meanwhile would be refused with a 503. A server whose wait runs out exits,
    and the ApiError of its going away ends this."""
    from tapdeck.app.host import SAY_EVERY_S

    every_s = SAY_EVERY_S if every_s is None else every_s
    said = 0
    while (wait := (await client.health()).engine_wait) is not None:
        if (due := int(wait.waited_s // every_s)) > said:
            said = due
            say(wait.line())
        await asyncio.sleep(min(POLL_S, every_s))


def _say_engine_of_remote_resume(run: RunSummary) -> None:
    """The line saying which engine a server resumes `run` on: the one it recorded (the server
    calls it again), or a warning that an older tapdeck recorded none."""
    from tapdeck.proxy.upstream.address import shown_url
    from tapdeck.runner.engines import EMBEDDED

    if not calls_a_model(run.plan.rollout.harness):
        return
    if run.engine_used is None:
        typer.echo(
            f"tapdeck rollout: warning: run {run.id} does not record the engine its "
            "rollouts called (an older tapdeck ran it); the server resumes it on its own "
            "engine",
            err=True,
        )
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


async def _follow(
    base: str,
    key: str | None,
    run_id: str,
    *,
    cancel: bool = False,
    engine_gone: Callable[[], str | None] | None = None,
    verify: ssl.SSLContext | bool = True,
) -> RunDetail:
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
    return f"{c.done}/{c.total} done · {c.ok} ok · {c.failed} failed" + (f" · {live}" if live else "")


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
