"""A run another process runs on the same data dir is seen running there, never "interrupted", and
is neither started again nor cancelled from here (its rollouts would run twice, its state file be
overwritten under it). The lock is the kernel's: a process that dies lets it go."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN
from tapdeck.runner.run_lock import RunLock
from tests.support.fake_vllm import hanging_engine
from tests.support.local_server import local_server_on
from tests.support.run_lock_holder import holding_run_lock


def test_the_lock_names_the_process_that_holds_it_and_dies_with_it(tmp_path: Path) -> None:
    here = RunLock(tmp_path)
    assert here.holder() is None
    with holding_run_lock(tmp_path) as other:
        assert here.holder() == other.pid
        assert here.claim() == other.pid and not here.held
    assert here.holder() is None  # no stale pid believed: the kernel dropped the lock
    assert here.claim() is None and here.held
    here.release()


def _admin(server: Any) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, timeout=30.0, headers={"Authorization": f"Bearer {server.admin_key}"}
    )


@pytest.mark.medium
def test_a_second_server_on_the_data_dir_sees_the_run_running_and_neither_resumes_nor_cancels_it(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with (
        hanging_engine() as engine,
        local_server_on(engine, data) as first,
        local_server_on(engine, data) as second,
        _admin(first) as a,
        _admin(second) as b,
    ):
        started = a.post("/admin/runs", json={"tasks": ["hello-file"], "k": 1, "timeout_s": 600})
        assert started.status_code == 200, started.text
        run_id = started.json()["id"]
        deadline = time.monotonic() + 120
        while not engine.held:  # its rollout waits on its first model call
            assert time.monotonic() < deadline
            time.sleep(0.2)
        state_before = (data / "runs" / run_id / "run.json").read_bytes()
        [seen] = [r for r in b.get("/admin/runs").json()["runs"] if r["id"] == run_id]
        assert seen["state"] == "running"  # not "interrupted": its process is alive
        assert b.get(f"/admin/runs/{run_id}").json()["state"] == "running"
        said = f"run {run_id} is running in process {os.getpid()} on this data dir"
        for action in ("resume", "cancel", f"rollouts/{run_id}.g000r00/cancel"):
            refused = b.post(f"/admin/runs/{run_id}/{action}")
            assert refused.status_code == 409 and refused.json()["detail"].startswith(said), action
        assert (data / "runs" / run_id / "run.json").read_bytes() == state_before
        assert a.post(f"/admin/runs/{run_id}/cancel").status_code == 200  # its own process can
        deadline = time.monotonic() + 120
        while b.get(f"/admin/runs/{run_id}").json()["state"] == "running":
            assert time.monotonic() < deadline, "the second server never saw the run end"
            time.sleep(0.2)
        assert b.get(f"/admin/runs/{run_id}").json()["state"] == "cancelled"


def test_resuming_a_run_another_process_runs_says_which_and_starts_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    run_dir = data / "runs" / "run-x"
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text(
        json.dumps({"id": "run-x", "created_at": 1.0, "plan": {}, "tasks": [{"name": "t", "path": "/t"}]})
    )
    (run_dir / "run.json").write_text(json.dumps({"state": "running", "created_at": 1.0}))
    with holding_run_lock(run_dir) as other:
        result = CliRunner().invoke(app, ["rollout", "--resume", "run-x", "--data-dir", str(data)])
    assert result.exit_code == EXIT_COULD_NOT_RUN, result.output
    assert result.output.strip() == (
        f"tapdeck rollout: run run-x is running in process {other.pid} on this data dir; follow it "
        "on that process's server (--server), or resume it once that process has ended"
    )
    assert sorted(p.name for p in run_dir.iterdir()) == ["plan.json", "run.json", "run.lock"]


def test_a_run_this_process_read_as_ended_is_read_afresh_once_another_process_resumes_it(
    tmp_path: Path,
) -> None:
    from tapdeck.runner.batch import BatchRunner

    data = tmp_path / "data"
    run_dir = data / "runs" / "run-x"
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text(
        json.dumps({"id": "run-x", "created_at": 1.0, "plan": {}, "tasks": [{"name": "t", "path": "/t"}]})
    )
    (run_dir / "run.json").write_text(json.dumps({"state": "cancelled", "created_at": 1.0}))
    batch = BatchRunner(None, data_dir=data, default_engine=None)
    assert [r.state for r in batch.list()] == ["cancelled"]  # read once, and kept
    with holding_run_lock(run_dir):  # another process resumes it
        (run_dir / "run.json").write_text(json.dumps({"state": "running", "created_at": 1.0}))
        assert [r.state for r in batch.list()] == ["running"]
