"""Cancelling one rollout of a run (`POST /admin/runs/{id}/rollouts/{rollout_id}/cancel`): that
rollout ends `cancelled` with its capture kept, the rest of the run goes on."""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path

import pytest

from tapdeck.schema.runs import RolloutResult
from tests.support.fake_vllm import hanging_engine
from tests.support.runner_server import RunnerServer, make_task, runner_server_on

pytestmark = pytest.mark.slow
WAIT_S = 180.0  # a bound for a trial to reach its agent on 2 shared cores, not a speed check


def _rollouts(server: RunnerServer, run_id: str) -> dict[str, dict]:
    return {r["rollout_id"]: r for r in server.http.get(f"/admin/runs/{run_id}").json()["rollouts"]}


def _until_hung(server: RunnerServer, engine, run_id: str, rid: str) -> dict:
    deadline = time.monotonic() + WAIT_S
    while True:
        rollout = _rollouts(server, run_id)[rid]
        if rollout["phase"] == "agent" and engine.held:
            return rollout
        assert time.monotonic() < deadline, f"{rid} never reached a hung model call: {rollout}"
        time.sleep(0.2)


def test_cancelling_one_rollout_keeps_its_capture_and_the_run_goes_on(tmp_path: Path) -> None:
    with hanging_engine() as engine, runner_server_on(engine, tmp_path / "data") as server:
        run = server.start(tasks=["hello-file"], k=3, concurrency=1, timeout_s=600)
        rid = [f"{run['id']}.g000r0{i}" for i in range(3)]
        _until_hung(server, engine, run["id"], rid[0])

        queued = server.http.post(f"/admin/runs/{run['id']}/rollouts/{rid[2]}/cancel")
        assert queued.status_code == 200, queued.text
        running = server.http.post(f"/admin/runs/{run['id']}/rollouts/{rid[0]}/cancel")
        assert running.status_code == 200
        assert RolloutResult.model_validate(running.json()).rollout_id == rid[0]  # its declared model
        # The next queued rollout starts: the run went on past the cancelled one.
        _until_hung(server, engine, run["id"], rid[1])
        server.http.post(f"/admin/runs/{run['id']}/rollouts/{rid[1]}/cancel")
        doc = server.wait(run["id"], WAIT_S)

        assert doc["state"] == "finished"
        by_id = {r["rollout_id"]: r for r in doc["rollouts"]}
        assert [by_id[r]["error_kind"] for r in rid] == ["cancelled"] * 3
        assert by_id[rid[0]]["error"] == "cancelled in phase agent"
        assert by_id[rid[2]]["error"] == "cancelled before it started" and by_id[rid[2]]["session_id"] is None
        for r in rid[:2]:
            session = server.http.get(f"/admin/sessions/{by_id[r]['session_id']}").json()
            assert session["state"] == "closed"  # the capture is kept, closed
            assert {"sandbox", "agent"} <= by_id[r]["phase_started"].keys()
        deadline = time.monotonic() + 30
        while engine.held:  # the hung engine calls were cancelled with their agents
            assert time.monotonic() < deadline, "an engine call outlived its cancelled rollout"
            time.sleep(0.1)

        missing = server.http.post(f"/admin/runs/{run['id']}/rollouts/{run['id']}.g009r00/cancel")
        assert missing.status_code == 404
        again = server.http.post(f"/admin/runs/{run['id']}/rollouts/{rid[0]}/cancel")
        assert again.status_code == 409 and "not running" in again.json()["detail"]


def _marked(marker: str) -> list[int]:
    """Pids of the processes whose command line holds `marker`."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in Path(entry.path, "cmdline").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
    return pids


def test_a_cancelled_rollouts_background_processes_are_killed(
    runner_server: RunnerServer, tmp_path: Path
) -> None:
    marker = f"tapdeck-bg-{secrets.token_hex(6)}"
    task = make_task(
        tmp_path / "dataset", "background", "echo 1 > /logs/verifier/reward.txt\n", agent_timeout_s=600
    )
    server_py = (
        "import http.server; http.server.HTTPServer(('127.0.0.1', 0), "
        "http.server.SimpleHTTPRequestHandler).serve_forever()"
    )
    # A plain background job, one in a session of its own, a daemonised server, then the agent waits.
    (task / "solution" / "solve.sh").write_text(
        f"#!/bin/bash\n(exec -a {marker} sleep 1000) &\n(setsid bash -c 'exec -a {marker} sleep 1000' &)\n"
        f'(nohup python3 -c "{server_py}" {marker} >/dev/null 2>&1 &)\n'
        f"exec -a {marker} sleep 1000\n"
    )
    hostdirs = tmp_path / "hostdirs"
    hostdirs.mkdir()
    run = runner_server.start(
        dataset=str(tmp_path / "dataset"),
        harness="oracle",
        timeout_s=600,
        sandbox_kwargs={"base_dir": str(hostdirs)},
    )
    rid = f"{run['id']}.g000r00"
    deadline = time.monotonic() + WAIT_S
    while len(_marked(marker)) < 4:
        assert time.monotonic() < deadline, f"the agent's processes never all started: {_marked(marker)}"
        time.sleep(0.2)
    cancelled = runner_server.http.post(f"/admin/runs/{run['id']}/rollouts/{rid}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    doc = runner_server.wait(run["id"], WAIT_S)
    assert [r["error_kind"] for r in doc["rollouts"]] == ["cancelled"]
    assert _marked(marker) == []
    assert list(hostdirs.iterdir()) == []
