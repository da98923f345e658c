"""The oracle harness (Harbor's reference solution) calls no model: `tapdeck rollout --harness oracle`
runs its batch on a server with no engine, never starting the embedded engine for it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

pytestmark = pytest.mark.slow  # a real Harbor trial of the oracle


def test_rollout_of_the_oracle_runs_without_starting_an_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tapdeck.app.cli import app
    from tapdeck.runner.batch import BatchRunner
    from tapdeck.runner.engine import registry

    def no_engine_for_oracle() -> None:
        raise AssertionError("the embedded engine was started for a run that calls no model")

    monkeypatch.setattr(registry, "acquire_embedded_engine", no_engine_for_oracle)
    result = CliRunner().invoke(
        app,
        [
            "rollout",
            "--harness",
            "oracle",
            "--task",
            "hello-file",
            "--timeout",
            "120",
            "--data-dir",
            str(tmp_path),
        ],
        env={"COLUMNS": "100"},
    )
    assert result.exit_code == 0, result.output
    assert "starting a local tapdeck server (no engine: oracle calls no model)…" in result.stderr
    assert "1/1 done, 1 ok, 0 failed" in result.stdout
    [run] = BatchRunner(None, data_dir=tmp_path, default_engine=None).list()
    assert run.engine_used == "none"


def test_resume_of_an_oracle_run_starts_no_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from tapdeck.app.cli import app
    from tapdeck.runner.batch import BatchRunner
    from tapdeck.runner.engine import registry
    from tapdeck.schema.runs import RolloutTemplate, RunPlan

    # An oracle run whose process died before its rollout ran: interrupted, its rollout queued.
    plan = RunPlan(tasks=["hello-file"], rollout=RolloutTemplate(harness="oracle", timeout_s=120))
    run = asyncio.run(BatchRunner(None, data_dir=tmp_path, default_engine=None).create(plan))

    def no_engine_for_oracle() -> None:
        raise AssertionError("the embedded engine was started to resume a run that calls no model")

    monkeypatch.setattr(registry, "acquire_embedded_engine", no_engine_for_oracle)
    result = CliRunner().invoke(
        app, ["rollout", "--resume", run.id, "--data-dir", str(tmp_path)], env={"COLUMNS": "100"}
    )
    assert result.exit_code == 0, result.output
    assert "starting a local tapdeck server (no engine: oracle calls no model)…" in result.stderr
    assert "1/1 done, 1 ok, 0 failed" in result.stdout
