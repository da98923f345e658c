"""Batches run on the runner's own asyncio loop while the server's loop is uvloop.

Under uvloop a detached `tmux new-session` started with `create_subprocess_exec` never reaches EOF
on its pipes (terminus-2's setup hung until its timeout), so the server hands runs to a plain
asyncio loop on a thread of its own and the capture service's coroutines cross back to its loop.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from tapdeck.proxy.service import CaptureService
from tapdeck.proxy.sessions.spec import SessionSpec
from tapdeck.proxy.store.database import Store
from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.runner.batch import BatchRunner, RunPlan
from tapdeck.runner.rollout import RolloutResult, RolloutSpec
from tapdeck.runner.runner_loop import RunnerLoop


def _on_uvloop(
    tmp_path: Path, body: Callable[[BatchRunner, CaptureService], Coroutine[Any, Any, None]], rollout_fn: Any
) -> None:
    """`body(batch, service)` on a uvloop loop (as the server's), the batch on a RunnerLoop."""

    async def main() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
        store = Store(tmp_path / "capture.db")
        service = CaptureService(
            store, default_engine=EngineSpec(url=dead, model="m"), public_url="http://127.0.0.1:9"
        )
        runner_loop = RunnerLoop()
        batch = BatchRunner(
            service, data_dir=tmp_path, default_engine=None, rollout_fn=rollout_fn, loop=runner_loop
        )
        try:
            await body(batch, service)
        finally:
            await asyncio.to_thread(runner_loop.stop)
            await service.aclose()
            store.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_a_run_started_from_uvloop_runs_on_asyncio_and_its_detached_tmux_returns(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    tmux_socket = f"tapdeck-test-{secrets.token_hex(4)}"

    async def rollout(service: Any, spec: RolloutSpec, *, on_update: Any) -> RolloutResult:
        seen["loop"] = type(asyncio.get_running_loop())
        seen["thread"] = threading.current_thread().name
        info = await service.open_session(SessionSpec(metadata={"rollout_id": spec.rollout_id}))
        # What the host sandbox does for terminus-2: a detached tmux session, its output piped.
        tmux = await asyncio.create_subprocess_exec(
            "tmux",
            "-L",
            tmux_socket,
            "new-session",
            "-d",
            "-s",
            "agent",
            "sleep 30",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            seen["tmux"] = await asyncio.wait_for(tmux.communicate(), 30)
        finally:
            subprocess.run(["tmux", "-L", tmux_socket, "kill-server"], capture_output=True)
        closed = await service.close_session(info.id)
        return RolloutResult(
            rollout_id=spec.rollout_id or "r",
            run_id=spec.run_id,
            task=spec.task,
            session_id=info.id,
            ok=closed.state == "closed",
            reward=1.0,
            phase="done",
        )

    async def body(batch: BatchRunner, service: CaptureService) -> None:
        seen["server_loop"] = type(asyncio.get_running_loop())
        summary = await batch.create(RunPlan(harness="oracle", tasks=["hello-file"], k=1))
        batch.start(summary.id)
        done = await batch.wait(summary.id)
        seen["summary"] = done
        seen["session"] = service.get(batch.results(summary.id)[0].session_id)

    _on_uvloop(tmp_path, body, rollout)

    assert seen["server_loop"] is uvloop.Loop
    assert issubclass(seen["loop"], asyncio.SelectorEventLoop) and seen["loop"] is not uvloop.Loop
    assert seen["thread"] == "tapdeck-runner"
    assert seen["tmux"] == (b"", b"")
    assert seen["summary"].state == "finished"
    assert seen["summary"].counts.ok == 1
    assert seen["session"].state == "closed"


def test_cancelling_a_run_from_the_server_loop_waits_for_its_teardown(tmp_path: Path) -> None:
    events: list[str] = []
    started = threading.Event()

    async def rollout(service: Any, spec: RolloutSpec, *, on_update: Any) -> RolloutResult:
        started.set()
        try:
            await asyncio.sleep(300)
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # a sandbox being torn down
            events.append("torn down")
            return RolloutResult(
                rollout_id=spec.rollout_id or "r",
                run_id=spec.run_id,
                task=spec.task,
                error_kind="cancelled",
                phase="failed",
            )
        raise AssertionError("not cancelled")

    async def body(batch: BatchRunner, _service: CaptureService) -> None:
        summary = await batch.create(RunPlan(harness="oracle", tasks=["hello-file"], k=1))
        batch.start(summary.id)
        assert await asyncio.to_thread(started.wait, 30)
        batch.cancel(summary.id)
        done = await batch.wait(summary.id)
        events.append(f"waited: {done.state}")

    _on_uvloop(tmp_path, body, rollout)

    assert events == ["torn down", "waited: cancelled"]
