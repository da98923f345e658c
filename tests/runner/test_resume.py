"""A run survives a crash: resuming runs exactly the rollouts without an outcome of their own (no
finished result line, cancelled, or ended by an engine that went away)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tapdeck.runner.batch import BatchRunner, RunPlan
from tapdeck.runner.rollout import RolloutResult
from tapdeck.runner.run_dir import RESULTS, load_results, rollout_id
from tapdeck.schema.findings import Finding
from tests.support.runner_server import RunnerServer

pytestmark = pytest.mark.slow


async def test_resume_after_a_crash_runs_only_the_unfinished_rollouts(runner_server: RunnerServer) -> None:
    # The "crashed" process: it wrote the run directory, finished four of six rollouts (one
    # cancelled and one whose engine went away, which must run again; one that failed on its own,
    # which must not), and died mid-write of a fifth line.
    crashed = BatchRunner(None, data_dir=runner_server.data_dir, default_engine=None)
    summary = await crashed.create(RunPlan(harness="oracle", tasks=["hello-file"], k=6, timeout_s=120))
    run_id = summary.id
    run_dir = Path(summary.path)

    def ended(index: int, **fields: object) -> RolloutResult:
        return RolloutResult(
            rollout_id=rollout_id(run_id, 0, index), run_id=run_id, task="hello-file", index=index, **fields
        )

    done = ended(0, ok=True, reward=1.0, phase="done", findings=[Finding.info("before_crash", "kept")])
    cancelled = ended(1, error_kind="cancelled", phase="failed")
    unreachable = ended(2, error_kind="engine_unreachable", phase="failed")
    failed = ended(3, error_kind="verifier_failed", phase="failed")
    with open(run_dir / RESULTS, "w") as fh:
        for result in (done, cancelled, unreachable, failed):
            fh.write(result.model_dump_json() + "\n")
        fh.write('{"rollout_id": "' + rollout_id(run_id, 0, 4) + '", "ok": tr')  # torn line

    listed = {r["id"]: r for r in runner_server.http.get("/admin/runs").json()["runs"]}
    assert listed[run_id]["state"] == "interrupted"
    assert listed[run_id]["counts"]["done"] == 4

    resp = runner_server.http.post(f"/admin/runs/{run_id}/resume")
    assert resp.status_code == 200, resp.text
    doc = runner_server.wait(run_id)

    assert doc["state"] == "finished"
    assert doc["counts"] == {"total": 6, "done": 6, "ok": 5, "failed": 1, "running": 0, "degenerate": 0}
    # The finished rollouts were not redone: same lines, no trial directories of their own.
    results = load_results(run_dir / RESULTS)
    assert results[done.rollout_id].findings == [Finding.info("before_crash", "kept")]
    assert results[failed.rollout_id].error_kind == "verifier_failed"
    trials = sorted(p.name for p in (run_dir / "trials").iterdir())
    assert trials == [rollout_id(run_id, 0, i) for i in (1, 2, 4, 5)]
    lines = (run_dir / RESULTS).read_text().splitlines()
    parsed = [json.loads(line) for line in lines if line.endswith("}")]
    assert [p["rollout_id"] for p in parsed].count(done.rollout_id) == 1


async def test_a_resumed_run_reads_running_from_its_start_and_interrupted_if_cancelled_unstarted(
    tmp_path: Path,
) -> None:
    # A client polling a resumed run for its end read the old "interrupted" until the run's task
    # got to write "running" on the runner's loop, and took the run as ended.
    crashed = BatchRunner(None, data_dir=tmp_path, default_engine=None)
    run_id = (await crashed.create(RunPlan(harness="oracle", tasks=["hello-file"], k=1))).id
    resumed = BatchRunner(None, data_dir=tmp_path, default_engine=None)
    assert resumed.get(run_id)[0].state == "interrupted"
    task = resumed.start(run_id)  # a task on this loop: it runs nothing before this test yields
    assert resumed.get(run_id)[0].state == "running"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert resumed.get(run_id)[0].state == "interrupted"
    again = resumed.start(run_id)  # the lock was given back
    again.cancel()
    with pytest.raises(asyncio.CancelledError):
        await again
