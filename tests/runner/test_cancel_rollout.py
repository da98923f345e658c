"""Cancelling one rollout of a run (`POST /admin/runs/{id}/rollouts/{rollout_id}/cancel`): that
rollout ends `cancelled` with its capture kept, the rest of the run goes on."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tapdeck.schema.runs import RolloutResult
from tests.conftest import hanging_engine
from tests.runner.conftest import RunnerServer, runner_server_on

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
