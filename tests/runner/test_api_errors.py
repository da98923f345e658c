"""The runner routes' refusals as a real server answers them (the runner's error family, rendered
by the one handler the server registers): status, the admin error shape, and the words. A refusal
that a plan gets when a run is made (400) is a conflict with the stored run when it is resumed (409)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tapdeck.schema.runs import RunPlan

NO_ENGINE = (
    "no embedded engine is running on this server; start it with the engine extra "
    "installed, or pass --engine URL"
)


def _write_run(data: Path, run_id: str, plan: RunPlan | None) -> None:
    path = data / "runs" / run_id
    (path / "trials").mkdir(parents=True)
    (path / "plan.json").write_text(
        "{not json"
        if plan is None
        else json.dumps(
            {
                "id": run_id,
                "created_at": 1.0,
                "plan": plan.model_dump(mode="json"),
                "tasks": [{"name": "hello-file", "path": "/nowhere"}],
                "left_out": [],
            }
        )
    )
    (path / "run.json").write_text(json.dumps({"state": "cancelled", "created_at": 1.0}))


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[httpx.Client]:
    """An admin client of a real server with no engine, on a data dir holding a few runs."""
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.config import ServerConfig

    data = tmp_path / "data"
    _write_run(data, "run-bad", None)
    _write_run(data, "run-oracle", RunPlan(harness="oracle", tasks=["hello-file"]))
    _write_run(data, "run-model", RunPlan(harness="terminus-2", tasks=["hello-file"]))
    other = data / "train" / "t-other"  # a training run this test's process runs, not the server
    other.mkdir(parents=True)
    (other / "run.json").write_text(
        json.dumps(
            {
                "run_id": "t-other",
                "recipe": "data-check",
                "argv": [],
                "env": {},
                "cwd": str(tmp_path),
                "run_dir": str(other),
                "trackio_dir": str(other),
                "trackio_project": "p",
                "state": "running",
                "pid": os.getpid(),
            }
        )
    )
    server = LocalServer(ServerConfig(port=0, data_dir=data), engine=False).start()
    try:
        with httpx.Client(
            base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {server.admin_key}"}
        ) as client:
            yield client
    finally:
        server.stop()


def _refusal(resp: httpx.Response) -> tuple[int, str, str]:
    body = resp.json()
    assert set(body) == {"detail", "kind", "retryable"} and body["retryable"] is False
    assert resp.headers["x-should-retry"] == "false"
    return resp.status_code, body["kind"], body["detail"]


def test_runner_refusals_keep_their_status_and_words(admin: httpx.Client) -> None:
    assert _refusal(admin.get("/admin/runs/run-none")) == (404, "not_found_error", "no run run-none")
    status, kind, detail = _refusal(admin.post("/admin/runs/run-bad/resume"))
    assert (status, kind) == (409, "conflict_error")
    assert detail.startswith("cannot resume run run-bad: ") and "plan.json is not a readable plan" in detail
    assert _refusal(admin.post("/admin/runs/run-oracle/rollouts/nope/cancel")) == (
        404,
        "not_found_error",
        "run run-oracle has no rollout nope",
    )
    assert _refusal(admin.post("/admin/runs/run-oracle/rollouts/run-oracle.g000r00/cancel")) == (
        409,
        "conflict_error",
        "rollout run-oracle.g000r00 is not running",
    )
    assert _refusal(admin.post("/admin/train", json={"recipe": "nope"}))[:2] == (400, "invalid_request_error")
    assert _refusal(admin.post("/admin/train", json={"recipe": "data-check", "run": "run-none"})) == (
        400,
        "invalid_request_error",
        "no rollout run 'run-none' on this server",
    )
    assert _refusal(admin.post("/admin/train", json={"recipe": "data-check", "args": ["--bogus"]}))[:2] == (
        422,
        "api_error",
    )
    assert _refusal(admin.get("/admin/train/t-nope/log")) == (
        404,
        "not_found_error",
        "no training run t-nope",
    )
    assert _refusal(admin.post("/admin/train/t-other/stop")) == (
        409,
        "conflict_error",
        f"t-other was launched by another server process (pid {os.getpid()}); stop it there",
    )


def test_a_plan_refused_when_made_is_a_conflict_when_its_stored_run_is_resumed(admin: httpx.Client) -> None:
    assert _refusal(admin.post("/admin/runs", json={"harness": "terminus-2"})) == (
        400,
        "invalid_request_error",
        NO_ENGINE,
    )
    assert _refusal(admin.post("/admin/runs/run-model/resume")) == (409, "conflict_error", NO_ENGINE)
