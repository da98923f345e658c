"""A run records the engine its rollouts call (`RunSummary.engine_used`): a plan's "embedded" is the
server's default engine, which is an engine URL on a server started with one."""

from __future__ import annotations

from pathlib import Path

from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.runner.batch import BatchRunner, RunPlan

URL = "http://gpu-box:8000/v1"


async def test_a_run_on_a_url_default_engine_records_the_url_not_embedded(tmp_path: Path) -> None:
    written = BatchRunner(None, data_dir=tmp_path, default_engine=EngineSpec(url=URL))
    run = await written.create(RunPlan(tasks=["hello-file"]))
    assert run.plan.rollout.engine == "embedded"
    assert run.engine_used == URL
    # Read back by a server started later (the TUI lists runs of earlier processes).
    restarted = BatchRunner(None, data_dir=tmp_path, default_engine=None)
    assert restarted.get(run.id)[0].engine_used == URL


async def test_a_run_on_the_embedded_default_engine_says_embedded(tmp_path: Path) -> None:
    batch = BatchRunner(
        None,
        data_dir=tmp_path,
        default_engine=EngineSpec(url="http://127.0.0.1:9/v1"),
        default_is_embedded=True,
    )
    assert (await batch.create(RunPlan(tasks=["hello-file"]))).engine_used == "embedded"
    chosen = await batch.create(RunPlan(tasks=["hello-file"], rollout={"engine": URL}))
    assert chosen.engine_used == URL


async def test_an_oracle_run_records_that_it_calls_no_engine(tmp_path: Path) -> None:
    batch = BatchRunner(None, data_dir=tmp_path, default_engine=None)
    assert (await batch.create(RunPlan(harness="oracle", tasks=["hello-file"]))).engine_used == "none"
