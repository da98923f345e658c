"""The batch runner's runs are loaded from disk by several threads at once after a restart
(`GET /admin/runs` lists them on a worker thread while other requests load them): each run is
loaded into one object, and listing never trips over a run another thread adds."""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tapdeck.runner import batch
from tapdeck.runner.batch import BatchRunner, RunPlan, RunSummary


async def _run_on_disk(data_dir: Path) -> str:
    """A run written by an earlier server process (its directory, nothing running)."""
    created = await BatchRunner(None, data_dir=data_dir, default_engine=None).create(
        RunPlan(harness="oracle", tasks=["hello-file"])
    )
    return created.id


async def test_two_threads_loading_one_run_get_the_same_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = await _run_on_disk(tmp_path)
    restarted = BatchRunner(None, data_dir=tmp_path, default_engine=None)
    both_reading = threading.Barrier(2, timeout=60)
    read = batch.read_results

    def read_together(path: Path) -> tuple[dict, list[str]]:
        both_reading.wait()  # each thread has looked for the run and found none loaded
        return read(path)

    monkeypatch.setattr(batch, "read_results", read_together)
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(restarted._load, [run_id, run_id])
    # One object: a run started through one of them is the run every later request sees.
    assert first is second is restarted._load(run_id)


async def test_listing_runs_while_another_thread_loads_one_lists_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = await _run_on_disk(tmp_path)
    restarted = BatchRunner(None, data_dir=tmp_path, default_engine=None)
    runs = tmp_path / "runs"
    summarize = batch.summarize

    def summarize_while_another_loads(run: batch._Run) -> RunSummary:
        if not (runs / "run-other").exists():  # a run another request loads meanwhile
            shutil.copytree(runs / run_id, runs / "run-other")
            other = threading.Thread(target=restarted._load, args=("run-other",))
            other.start()
            other.join()
        return summarize(run)

    monkeypatch.setattr(batch, "summarize", summarize_while_another_loads)
    assert [s.id for s in restarted.list()] == [run_id]
    assert sorted(s.id for s in restarted.list()) == sorted([run_id, "run-other"])
