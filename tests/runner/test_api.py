"""The runner's admin routes: auth, catalog, listing, cancel, export."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.runner_server import RunnerServer

pytestmark = pytest.mark.slow


def test_runner_routes_need_the_admin_key(runner_server: RunnerServer) -> None:
    for method, path in (
        ("GET", "/admin/catalog"),
        ("GET", "/admin/runs"),
        ("POST", "/admin/runs"),
        ("POST", "/admin/runs/x/cancel"),
    ):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            resp = httpx.request(method, runner_server.local.url + path, headers=headers, json={})
            assert resp.status_code == 401, (method, path, resp.text)


def test_catalog_lists_the_sample_dataset_harnesses_sandboxes_and_the_running_engine(
    runner_server: RunnerServer,
) -> None:
    doc = runner_server.http.get("/admin/catalog").json()
    assert doc["defaults"] == {
        "dataset": "sample",
        "harness": "terminus-2",
        "sandbox": "host",
        "engine": "embedded",
    }
    sample = next(d for d in doc["datasets"] if d["name"] == "sample")
    assert "hello-file" in [t["name"] for t in sample["tasks"]]
    assert {"terminus-2", "oracle"} <= {h["name"] for h in doc["harnesses"]}
    assert next(s for s in doc["sandboxes"] if s["name"] == "host")["available"]
    engine = doc["engines"][0]
    assert engine["name"] == "embedded" and engine["reachable"] and engine["tier"] == "tokens"


def test_bad_plans_are_400_with_the_reason(runner_server: RunnerServer) -> None:
    resp = runner_server.http.post("/admin/runs", json={"tasks": ["nope"], "harness": "oracle"})
    assert resp.status_code == 400 and "hello-file" in resp.json()["detail"]
    resp = runner_server.http.post("/admin/runs", json={"engine": "ftp://x"})
    assert resp.status_code == 400 and "http" in resp.json()["detail"]
    # Refused before a run exists, as unknown tasks are (not a run of `bad_plan` rollouts).
    before = runner_server.http.get("/admin/runs").json()["runs"]
    resp = runner_server.http.post("/admin/runs", json={"harness": "oracle", "sandbox": "bogus"})
    assert resp.status_code == 400 and "unknown sandbox 'bogus'" in resp.json()["detail"]
    resp = runner_server.http.post("/admin/runs", json={"engine_model": "nosuch"})
    assert resp.status_code == 400 and "it serves smollm2" in resp.json()["detail"]
    assert runner_server.http.get("/admin/runs").json()["runs"] == before
    assert runner_server.http.get("/admin/runs/run-none").status_code == 404


def test_cancelling_a_running_run_ends_its_rollouts_as_cancelled(runner_server: RunnerServer) -> None:
    run = runner_server.start(tasks=["hello-file"], k=2, timeout_s=300)
    deadline = time.monotonic() + 120
    while not any(
        r["phase"] == "agent" for r in runner_server.http.get(f"/admin/runs/{run['id']}").json()["rollouts"]
    ):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    summary = runner_server.http.post(f"/admin/runs/{run['id']}/cancel").json()
    assert summary["id"] == run["id"]
    doc = runner_server.wait(run["id"])
    assert doc["state"] == "cancelled"
    started = [r for r in doc["rollouts"] if r["phase"] != "queued"]
    assert started and all(r["error_kind"] == "cancelled" and not r["ok"] for r in started)
    listed = {r["id"]: r for r in runner_server.http.get("/admin/runs").json()["runs"]}
    assert listed[run["id"]]["state"] == "cancelled"


def test_export_writes_training_rows_with_group_and_reward(runner_server: RunnerServer) -> None:
    doc = runner_server.run(
        tasks=["hello-file"],
        timeout_s=600,
        call_budget=1,
        agent_kwargs={"max_turns": 1, "llm_kwargs": {"max_tokens": 16}},
    )
    resp = runner_server.http.post(f"/admin/runs/{doc['id']}/export", json={"format": "jsonl"})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    import json
    from pathlib import Path

    rows = [json.loads(line) for line in Path(out["path"]).read_text().splitlines()]
    assert out["rows"] == len(rows) == 1
    row = rows[0]
    assert row["group"] == 0 and row["reward"] == doc["rollouts"][0]["reward"]
    assert row["turns"] and row["turns"][0]["prompt_token_ids"] and row["turns"][0]["completion_token_ids"]
