"""A resumed run calls the engine its first rollouts called (`RunSummary.engine_used`), never
another: a local `tapdeck rollout --resume RUN` starts its server on that engine, refuses an
--engine or --engine-model that names another, and warns for a run an older tapdeck wrote; a
server resumes a run on the engine it recorded, not on its own default one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_USAGE
from tapdeck.proxy.store.database import Store
from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.runner.batch import BatchRunner
from tapdeck.runner.errors import PlanError
from tapdeck.runner.run_dir import STATE
from tapdeck.schema.runs import RolloutTemplate, RunPlan, RunSummary
from tests.support.fake_vllm import models_only_engine
from tests.support.local_server import local_server_on
from tests.support.ports import free_port


def _interrupted_run(data: Path, engine_url: str, model: str | None = None) -> RunSummary:
    """A terminus-2 run whose process died before its rollout ran, started on a server whose
    default engine is `engine_url` (as `tapdeck rollout --engine URL` starts one)."""
    plan = RunPlan(
        tasks=["hello-file"],
        rollout=RolloutTemplate(timeout_s=120, engine_model=model, settings={"max_turns": 1}),
    )
    batch = BatchRunner(None, data_dir=data, default_engine=EngineSpec(url=engine_url))
    return asyncio.run(batch.create(plan))


def _resume(data: Path, run_id: str, *args: str) -> Any:
    return CliRunner().invoke(app, ["rollout", "--resume", run_id, "--data-dir", str(data), *args])


def _sessions_engines(data: Path) -> list[str]:
    store = Store(data / "capture.db")
    try:
        return [s["engine"]["url"] for s in store.list_sessions()]
    finally:
        store.close()


@pytest.mark.slow
def test_a_local_resume_without_engine_calls_the_engine_the_run_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAPDECK_ENGINE_REGISTRY", str(tmp_path / "registry"))  # no engine to reuse
    with models_only_engine() as engine:
        used = f"{engine}/v1"
        run = _interrupted_run(tmp_path, used)
        result = _resume(tmp_path, run.id)
    text = " ".join(result.output.split())
    assert f"resuming on the engine the run used: {used}" in text
    assert "embedded engine" not in text
    assert f"engine {used}" in text
    assert _sessions_engines(tmp_path) == [used]  # its rollout's calls went there
    state = json.loads((Path(run.path) / STATE).read_text())
    assert state["engine_used"] == used


def test_a_local_resume_with_another_engine_is_refused_naming_both(
    tmp_path: Path, dead_engine_url: str
) -> None:
    run = _interrupted_run(tmp_path, dead_engine_url)
    other = f"http://127.0.0.1:{free_port()}/v1"
    for given, named in ((other, f"not --engine {other}"), ("embedded", "not --engine embedded")):
        result = _resume(tmp_path, run.id, "--engine", given)
        assert result.exit_code == EXIT_USAGE, result.output
        assert result.output.strip() == (
            f"tapdeck rollout: run {run.id}'s rollouts called the engine at {dead_engine_url}, "
            f"{named}, and the rollouts of one run must come from one engine: drop --engine to "
            f"resume on the engine it used, or start a new run with --engine {given}"
        )
    # The same engine spelt HOST:PORT is not another one: it is started (and does not answer, with
    # no time to wait for it).
    bare = dead_engine_url.removeprefix("http://").removesuffix("/v1")
    same = _resume(tmp_path, run.id, "--engine", bare, "--engine-wait", "0")
    assert same.exit_code == EXIT_COULD_NOT_RUN, same.output
    assert f"tried GET {dead_engine_url}/models" in " ".join(same.output.split())
    [again] = BatchRunner(None, data_dir=tmp_path, default_engine=None).list()
    assert (again.state, again.counts.done) == ("interrupted", 0)


def test_a_local_resume_with_another_engine_model_is_refused_naming_both(
    tmp_path: Path, dead_engine_url: str
) -> None:
    run = _interrupted_run(tmp_path, dead_engine_url, model="first-model")
    result = _resume(tmp_path, run.id, "--engine-model", "other-model")
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.output.strip() == (
        f"tapdeck rollout: run {run.id}'s rollouts called model 'first-model', not --engine-model "
        "'other-model', and the rollouts of one run must come from one model: drop "
        "--engine-model to resume on the one it used, or start a new run with it"
    )


def test_a_local_resume_of_a_run_that_recorded_no_engine_warns_and_goes_by_engine(
    tmp_path: Path, dead_engine_url: str
) -> None:
    run = _interrupted_run(tmp_path, "http://gpu-box:8000/v1")
    state_file = Path(run.path) / STATE
    state = json.loads(state_file.read_text())
    state.pop("engine_used"), state.pop("engine_model_used", None)  # as an older tapdeck wrote it
    state_file.write_text(json.dumps(state))
    result = _resume(tmp_path, run.id, "--engine", dead_engine_url, "--engine-wait", "0")
    assert result.exit_code == EXIT_COULD_NOT_RUN, result.output
    text = " ".join(result.output.split())
    assert (
        f"tapdeck rollout: warning: run {run.id} does not record the engine its rollouts "
        f"called (an older tapdeck ran it); resuming on the engine at {dead_engine_url} as "
        "--engine says"
    ) in text
    assert f"tried GET {dead_engine_url}/models" in text


@pytest.mark.slow
def test_a_server_resumes_a_run_on_the_engine_it_recorded_not_its_own(tmp_path: Path) -> None:
    with models_only_engine() as first, models_only_engine() as second:
        used = f"{first}/v1"
        run = _interrupted_run(tmp_path, used)
        own = SimpleNamespace(base_url=f"{second}/v1", served_name="smollm2")
        with local_server_on(own, tmp_path) as server:
            result = CliRunner().invoke(
                app, ["rollout", "--server", server.url, "--admin-key", server.admin_key, "--resume", run.id]
            )
            assert [s["engine"]["url"] for s in server.service.store.list_sessions()] == [used]
            assert f"resuming on the engine the run used: {used}" in result.output
            assert json.loads((Path(run.path) / STATE).read_text())["engine_used"] == used


async def test_a_server_with_a_url_engine_refuses_to_resume_an_embedded_engine_run(tmp_path: Path) -> None:
    embedded = EngineSpec(url="http://127.0.0.1:9/v1")
    written = BatchRunner(None, data_dir=tmp_path, default_engine=embedded, default_is_embedded=True)
    run = await written.create(RunPlan(tasks=["hello-file"]))
    elsewhere = BatchRunner(None, data_dir=tmp_path, default_engine=EngineSpec(url="http://gpu-box:8000/v1"))
    with pytest.raises(PlanError) as refused:
        elsewhere.start(run.id)
    assert str(refused.value) == (
        f"run {run.id}'s rollouts called the embedded engine and this server's engine is "
        "http://gpu-box:8000/v1: resume it on a server started without --engine, so that all its "
        "rollouts come from one engine"
    )
    assert elsewhere.get(run.id)[0].state == "interrupted"
