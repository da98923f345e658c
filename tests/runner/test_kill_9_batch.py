"""`kill -9` of a `tapdeck serve` in the middle of a real batch, then a restart on the same data dir.

A real run: terminus-2 trials on the host sandbox, two at once, each calling the capture proxy
through a relay (the run's `public_url`) that records every reply the proxy actually delivered,
by the id the proxy gave it (its own, one per call, kept with the turn) and the session key it
answered. The engine is
a loopback server answering with recorded vLLM bodies; once a rollout has finished it holds every
call that continues a conversation, so when the server is killed calls are in flight and the
interrupted rollouts have delivered replies behind them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response

from tapdeck.proxy.http.uvicorn_thread import ThreadedServer
from tapdeck.proxy.store.database import Store
from tapdeck.runner.run_dir import RESULTS, load_results
from tests.support.fake_vllm import FakeVllm, continues_a_conversation
from tests.support.ports import free_port
from tests.support.processes import SandboxProcesses
from tests.support.tapdeck_process import serve_process, wait_health

pytestmark = pytest.mark.slow

K, CONCURRENCY = 4, 2


class Relay:
    """A loopback HTTP relay in front of the proxy that records each chat reply it received whole:
    (session key, reply id), what the harness was delivered."""

    def __init__(self, target: str) -> None:
        self.delivered: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        app = FastAPI()

        @app.api_route("/{path:path}", methods=["GET", "POST"])
        async def relay(path: str, request: Request) -> Response:
            body = await request.body()
            headers = {
                k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
            }
            try:
                async with httpx.AsyncClient(timeout=300) as client:
                    reply = await client.request(
                        request.method,
                        f"{target}/{path}",
                        content=body,
                        headers=headers,
                        params=request.query_params,
                    )
            except httpx.HTTPError as exc:  # the server died under this call: nothing delivered
                return Response(f"relay: {type(exc).__name__}", status_code=502)
            if request.method == "POST" and path.endswith("chat/completions") and reply.status_code == 200:
                key = request.headers.get("authorization", "").removeprefix("Bearer ")
                with self._lock:
                    self.delivered.append((key, reply.json()["id"]))
            return Response(
                reply.content, status_code=reply.status_code, media_type=reply.headers.get("content-type")
            )

        self.server = ThreadedServer(app, "127.0.0.1", 0, name="delivery-relay").start()

    def snapshot(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self.delivered)


def _until(what: str, check: Any, attempts: int = 3000) -> Any:
    """Poll `check()` every 0.1 s until it returns something truthy (bounded)."""
    for _ in range(attempts):
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"never happened: {what}")


def _admin(url: str, data: Path) -> httpx.Client:
    return httpx.Client(
        base_url=url,
        timeout=60,
        headers={"Authorization": f"Bearer {(data / 'admin.key').read_text().strip()}"},
    )


def test_kill_9_mid_batch_keeps_every_delivered_turn_and_resume_runs_only_the_unfinished_rollouts(
    tmp_path: Path,
) -> None:
    up = FakeVllm().start()
    data, port = tmp_path / "data", free_port()
    url = f"http://127.0.0.1:{port}"
    relay = Relay(url)
    proc = serve_process(port, data, up.base_url)
    trial = None
    try:
        wait_health(url, proc)
        admin = _admin(url, data)
        run = admin.post(
            "/admin/runs",
            json={
                "tasks": ["hello-file"],
                "harness": "terminus-2",
                "k": K,
                "concurrency": CONCURRENCY,
                "timeout_s": 300,
                "settings": {"max_turns": 2},
                "public_url": relay.server.url,
            },
        ).json()
        run_id, run_dir = run["id"], Path(run["path"])

        def done() -> int:
            return admin.get(f"/admin/runs/{run_id}").json()["counts"]["done"]

        _until("a rollout finished", done)
        up.hold = continues_a_conversation
        _until("two rollouts with a call held in flight", lambda: up.held >= CONCURRENCY)
        trial = SandboxProcesses(proc.pid)
        assert any(c.startswith("tmux") for c in trial.commands()), trial.commands()
        delivered = relay.snapshot()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert trial.survivors() == [], "processes of the killed server's trials are still running"
        up.hold = None

        finished = load_results(run_dir / RESULTS)
        assert 1 <= len(finished) <= K - CONCURRENCY

        proc = serve_process(port, data, up.base_url)
        wait_health(url, proc)
        admin = _admin(url, data)  # each start writes a new admin key
        listed = {r["id"]: r for r in admin.get("/admin/runs").json()["runs"]}
        assert listed[run_id]["state"] == "interrupted"
        assert listed[run_id]["counts"]["done"] == len(finished)
        before = {
            s["metadata"]["rollout_id"]: s
            for s in admin.get("/admin/sessions").json()["sessions"]
            if s["metadata"].get("run_id") == run_id
        }
        for rid, session in before.items():
            assert session["state"] == ("closed" if rid in finished else "interrupted"), session

        assert admin.post(f"/admin/runs/{run_id}/resume").status_code == 200
        doc = _until(
            "the resumed run finished",
            lambda: d if (d := admin.get(f"/admin/runs/{run_id}").json())["state"] != "running" else None,
        )
        assert doc["state"] == "finished"
        assert doc["counts"] == {"total": K, "done": K, "ok": K, "failed": 0, "running": 0, "degenerate": 0}
        after = {r["rollout_id"]: r for r in doc["rollouts"]}
        for rid, result in finished.items():  # finished before the kill: not run again
            assert after[rid]["session_id"] == result.session_id
        for rid in set(after) - set(finished):  # the rest ran again, in sessions of their own
            assert after[rid]["session_id"] != before.get(rid, {}).get("id")
            assert after[rid]["error_kind"] is None, after[rid]
        lines = (run_dir / RESULTS).read_text().splitlines()
        assert sorted(json.loads(line)["rollout_id"] for line in lines) == sorted(after)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if trial is not None:
            trial.close()
        relay.server.stop()
        up.stop()

    # Every reply delivered before the kill is a stored turn: those of one session key are the
    # first turns of one session, in order.
    stored: dict[str, tuple[str, int]] = {}
    with Store(data / "capture.db") as store:
        for rid, session in before.items():
            for seq, turn in enumerate(store.load_session(session["id"])[1]):
                stored[turn.meta["reply_id"]] = (rid, seq)
    by_key: dict[str, list[str]] = {}
    for key, reply_id in delivered:
        by_key.setdefault(key, []).append(reply_id)
    assert len(by_key) > len(finished), "no interrupted rollout had a delivered reply"
    for reply_ids in by_key.values():
        assert all(r in stored for r in reply_ids), "a delivered reply is not in the store"
        [rid] = {stored[r][0] for r in reply_ids}
        assert [stored[r][1] for r in reply_ids] == list(range(len(reply_ids)))
