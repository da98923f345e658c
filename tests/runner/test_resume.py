"""A run survives a crash: resuming runs exactly the rollouts without a finished result line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tapdeck.runner.batch import RESULTS, BatchRunner, RunPlan, load_results, rollout_id
from tapdeck.runner.rollout import RolloutResult
from tapdeck.schema.findings import Finding
from tests.runner.conftest import RunnerServer

pytestmark = pytest.mark.slow


async def test_resume_after_a_crash_runs_only_the_unfinished_rollouts(runner_server: RunnerServer) -> None:
    # The "crashed" process: it wrote the run directory, finished two of four rollouts (one of
    # them cancelled, which must run again), and died mid-write of a third line.
    crashed = BatchRunner(None, data_dir=runner_server.data_dir, default_engine=None)
    summary = await crashed.create(RunPlan(harness="oracle", tasks=["hello-file"], k=4, timeout_s=120))
    run_id = summary.id
    run_dir = Path(summary.path)
    done = RolloutResult(rollout_id=rollout_id(run_id, 0, 0), run_id=run_id, task="hello-file",
                         index=0, ok=True, reward=1.0, phase="done", findings=[Finding.info("before_crash", "kept")])
    cancelled = RolloutResult(rollout_id=rollout_id(run_id, 0, 1), run_id=run_id, task="hello-file",
                              index=1, error_kind="cancelled", phase="failed")
    with open(run_dir / RESULTS, "w") as fh:
        fh.write(done.model_dump_json() + "\n" + cancelled.model_dump_json() + "\n")
        fh.write('{"rollout_id": "' + rollout_id(run_id, 0, 2) + '", "ok": tr')  # torn line

    listed = {r["id"]: r for r in runner_server.http.get("/admin/runs").json()["runs"]}
    assert listed[run_id]["state"] == "interrupted"
    assert listed[run_id]["counts"]["done"] == 2

    resp = runner_server.http.post(f"/admin/runs/{run_id}/resume")
    assert resp.status_code == 200, resp.text
    doc = runner_server.wait(run_id)

    assert doc["state"] == "finished"
    assert doc["counts"] == {"total": 4, "done": 4, "ok": 4, "failed": 0, "running": 0}
    # The finished rollout was not redone: same line, no trial directory of its own.
    results = load_results(run_dir / RESULTS)
    assert results[done.rollout_id].findings == [Finding.info("before_crash", "kept")]
    trials = sorted(p.name for p in (run_dir / "trials").iterdir())
    assert trials == [rollout_id(run_id, 0, i) for i in (1, 2, 3)]
    lines = (run_dir / RESULTS).read_text().splitlines()
    parsed = [json.loads(line) for line in lines if line.endswith("}")]
    assert [p["rollout_id"] for p in parsed].count(done.rollout_id) == 1
