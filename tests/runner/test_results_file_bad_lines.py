"""A run's results.jsonl read back: a torn last line (a crash mid-append) is ignored quietly; any
other bad line is named in a warning, and a result this version cannot read (another version's
schema) stops a resume from running its finished rollout again."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN
from tapdeck.runner.batch import BatchRunner, RunPlan
from tapdeck.runner.errors import PlanError
from tapdeck.runner.rollout import RolloutSpec
from tapdeck.runner.run_dir import RESULTS, load_results, read_results, rollout_id
from tapdeck.schema.runs import RolloutResult
from tests.support.fake_vllm import models_only_engine
from tests.support.local_server import local_server_on


def _line(run_id: str, index: int) -> str:
    return (
        RolloutResult(
            rollout_id=rollout_id(run_id, 0, index),
            run_id=run_id,
            task="hello-file",
            index=index,
            ok=True,
            reward=1.0,
            phase="done",
            finished_at=1.0,
        ).model_dump_json()
        + "\n"
    )


def _other_schema(run_id: str, index: int) -> str:
    """A finished result as a later version might write it: a value this version does not know."""
    return _line(run_id, index).replace('"atif":"none"', '"atif":"partial"')


TORN = '{"rollout_id": "run-1.g000r0'


def test_a_torn_last_line_is_ignored_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / RESULTS
    path.write_text(_line("run-1", 0) + TORN)
    with caplog.at_level(logging.WARNING, logger="tapdeck.runner"):
        assert read_results(path) == (
            {rollout_id("run-1", 0, 0): RolloutResult.model_validate_json(_line("run-1", 0))},
            [],
        )
    assert not caplog.records


def test_every_other_bad_line_is_named_in_a_warning_and_the_good_ones_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / RESULTS
    path.write_text(_line("run-1", 0) + TORN + "\n" + _other_schema("run-1", 1) + _line("run-1", 2))
    with caplog.at_level(logging.WARNING, logger="tapdeck.runner"):
        results, unreadable = read_results(path)
    assert list(results) == [rollout_id("run-1", 0, 0), rollout_id("run-1", 0, 2)]
    assert unreadable == [
        f"{path}:3: not a rollout result (atif: Input should be 'match', 'mismatch' or 'none')"
    ]
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings[0].startswith(f"{path}:2: not JSON, skipped")
    assert warnings[1] == f"{unreadable[0]}, skipped"
    assert load_results(path) == results


async def _run_with_lines(data_dir: Path, *lines: str, k: int = 2) -> tuple[str, Path]:
    """A run of k rollouts written by an earlier process, with these lines in its results."""
    created = await BatchRunner(None, data_dir=data_dir, default_engine=None).create(
        RunPlan(harness="oracle", tasks=["hello-file"], k=k)
    )
    results = Path(created.path) / RESULTS
    results.write_text("".join(line.replace("{run}", created.id) for line in lines))
    return created.id, results


async def test_a_run_with_a_result_this_version_cannot_read_is_not_resumed_until_it_is_removed(
    tmp_path: Path,
) -> None:
    ran: list[str] = []

    async def rollout(service: Any, spec: RolloutSpec, **_: Any) -> RolloutResult:
        ran.append(spec.rollout_id)
        return RolloutResult.model_validate_json(_line(spec.run_id, spec.index))

    run_id, results = await _run_with_lines(tmp_path, _line("{run}", 0), _other_schema("{run}", 1))
    restarted = BatchRunner(None, data_dir=tmp_path, default_engine=None, rollout_fn=rollout)
    with pytest.raises(PlanError) as refused:
        restarted.start(run_id)
    assert str(refused.value) == (
        f"run {run_id} cannot resume: 1 line(s) of its results.jsonl hold results this tapdeck "
        f"cannot read ({results}:2: not a rollout result (atif: Input should be 'match', 'mismatch' "
        "or 'none')); read them with the tapdeck that wrote them, or delete those lines to run "
        "their rollouts again"
    )
    results.write_text(_line(run_id, 0))
    restarted.start(run_id)
    assert (await restarted.wait(run_id)).counts.done == 2
    assert ran == [rollout_id(run_id, 0, 1)]


@pytest.mark.parametrize("last", ["torn", "whole"])
async def test_a_result_recorded_after_a_crash_starts_a_line_of_its_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, last: str
) -> None:
    async def rollout(service: Any, spec: RolloutSpec, **_: Any) -> RolloutResult:
        return RolloutResult.model_validate_json(_line(spec.run_id, spec.index))

    # The crash came mid-append of the second result, or just before its newline.
    second = TORN if last == "torn" else _line("{run}", 1).rstrip("\n")
    run_id, results = await _run_with_lines(tmp_path, _line("{run}", 0), second, k=3)
    restarted = BatchRunner(None, data_dir=tmp_path, default_engine=None, rollout_fn=rollout)
    restarted.start(run_id)
    await restarted.wait(run_id)
    # The torn line is cut (it never was a result); the whole one is ended and kept, not redone.
    assert results.read_text() == _line(run_id, 0) + _line(run_id, 1) + _line(run_id, 2)
    with caplog.at_level(logging.WARNING, logger="tapdeck.runner"):
        assert len(read_results(results)[0]) == 3
    assert not caplog.records


def test_rollout_resume_says_why_a_server_refused_it(tmp_path: Path) -> None:
    run_id, _ = asyncio.run(_run_with_lines(tmp_path, _line("{run}", 0), _other_schema("{run}", 1)))
    with models_only_engine() as url:
        engine = SimpleNamespace(base_url=f"{url}/v1", served_name="smollm2")
        with local_server_on(engine, tmp_path) as server:
            result = CliRunner().invoke(
                app, ["rollout", "--server", server.url, "--admin-key", server.admin_key, "--resume", run_id]
            )
    assert result.exit_code == EXIT_COULD_NOT_RUN, result.output
    text = " ".join(result.output.split())
    assert f"run {run_id} cannot resume: 1 line(s) of its results.jsonl hold results" in text
    assert "following it" not in text
