"""`tapdeck runs`: the data dir's runs listed headless from their files, or one run's rollouts as
`tapdeck rollout` prints them; nothing started, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tests.support.run_lock_holder import holding_run_lock


def _run(
    data: Path,
    run_id: str,
    created: float,
    state: str,
    results: list[dict[str, Any]],
    *,
    k: int = 2,
    harness: str = "oracle",
) -> Path:
    """A run folder as a server leaves it: plan, state and results."""
    path = data / "runs" / run_id
    path.mkdir(parents=True)
    (path / "plan.json").write_text(
        json.dumps(
            {
                "id": run_id,
                "created_at": created,
                "plan": {"k": k, "rollout": {"harness": harness}},
                "tasks": [{"name": "hello-file", "path": "/t/hello-file"}],
            }
        )
    )
    (path / "run.json").write_text(json.dumps({"state": state, "created_at": created}))
    (path / "results.jsonl").write_text(
        "".join(
            json.dumps({"run_id": run_id, "task": "hello-file", "group": 0, "phase": "done", **r}) + "\n"
            for r in results
        )
    )
    return path


@pytest.fixture
def data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    _run(
        data,
        "run-20261201-100000-aaaa",
        1.0,
        "finished",
        [
            {"rollout_id": "run-20261201-100000-aaaa.g000r00", "index": 0, "ok": True, "reward": 1.0},
            {
                "rollout_id": "run-20261201-100000-aaaa.g000r01",
                "index": 1,
                "ok": False,
                "reward": 0.0,
                "phase": "failed",
                "error_kind": "timeout",
                "error": "agent timed out after 180 s",
            },
        ],
    )
    _run(data, "run-20261202-100000-bbbb", 2.0, "running", [])  # its process died
    return data


def _runs(*args: str) -> Any:
    return CliRunner().invoke(app, ["runs", *args])


def test_runs_lists_each_run_newest_first_with_its_state_and_outcome(data: Path) -> None:
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    result = _runs("--data-dir", str(data))
    assert result.exit_code == 0, result.output
    assert [line.split() for line in result.output.splitlines()] == [
        ["run", "state", "harness", "done", "ok", "fail", "canc", "reward"],
        ["run-20261202-100000-bbbb", "interrupted", "oracle", "0/2", "0", "0", "0", "-"],
        ["run-20261201-100000-aaaa", "finished", "oracle", "2/2", "1", "1", "0", "0.50"],
    ]
    assert all(len(line) <= 80 for line in result.output.splitlines())
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == before  # nothing written
    listed = json.loads(_runs("--data-dir", str(data), "--json").output)
    assert [(r["id"], r["state"]) for r in listed["runs"]] == [
        ("run-20261202-100000-bbbb", "interrupted"),
        ("run-20261201-100000-aaaa", "finished"),
    ]


def test_runs_lists_every_harness_tapdeck_offers_by_its_whole_name_in_80_columns(tmp_path: Path) -> None:
    from tapdeck.runner.harnesses import HARNESSES

    data = tmp_path / "data"
    for i, harness in enumerate(HARNESSES):
        _run(
            data, f"run-20261201-1000{i:02d}-aaaa", float(i), "running", [], k=100, harness=harness
        )  # its process died: `interrupted`, the longest state
    result = _runs("--data-dir", str(data))
    assert result.exit_code == 0, result.output
    header, *rows = result.output.splitlines()
    assert header.split() == ["run", "state", "harness", "done", "ok", "fail", "canc", "reward"]
    assert sorted(line.split()[2] for line in rows) == sorted(HARNESSES), result.output
    assert all(len(line) <= 80 for line in result.output.splitlines()), result.output


def test_runs_shows_a_run_another_process_runs_as_running(data: Path) -> None:
    with holding_run_lock(data / "runs" / "run-20261202-100000-bbbb"):
        result = _runs("--data-dir", str(data))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1].split()[:2] == ["run-20261202-100000-bbbb", "running"]


def test_runs_of_one_run_prints_its_rollouts_and_why_they_failed(data: Path) -> None:
    result = _runs("run-20261201-100000-aaaa", "--data-dir", str(data))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["task", "grp", "#", "reward", "ok", "calls", "atif", "error"]
    # the group's two rollouts told apart by their index
    assert lines[1].split() == ["hello-file", "0", "0", "1.00", "yes", "0", "none"]
    assert lines[2].split() == ["hello-file", "0", "1", "0.00", "no", "0", "none", "timeout"]
    assert "hello-file: agent timed out after 180 s" in lines
    assert "run run-20261201-100000-aaaa finished: 2/2 done, 1 ok, 1 failed" in lines
    doc = json.loads(_runs("run-20261201-100000-aaaa", "--data-dir", str(data), "--json").output)
    assert [r["reward"] for r in doc["rollouts"]] == [1.0, 0.0]


def test_runs_of_a_cancelled_run_counts_the_cancel_apart_and_the_unrun_rollout_as_not_ok(
    tmp_path: Path,
) -> None:
    """As Runs and the runs list count them: a cancelled rollout is no failure, and a rollout the
    run never started is not `…` (still going)."""
    data = tmp_path / "data"
    _run(
        data,
        "run-20261201-100000-cccc",
        1.0,
        "cancelled",
        [
            {
                "rollout_id": "run-20261201-100000-cccc.g000r00",
                "index": 0,
                "ok": False,
                "phase": "failed",
                "error_kind": "cancelled",
                "error": "cancelled in phase agent",
            }
        ],
    )
    result = _runs("run-20261201-100000-cccc", "--data-dir", str(data))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[2].split() == ["hello-file", "0", "1", "-", "-", "0", "none"]
    assert "run run-20261201-100000-cccc cancelled: 1/2 done, 0 ok, 0 failed, 1 cancelled" in lines
    assert "failures: none · cancelled 1" in lines


def test_a_runs_rollouts_graded_degenerate_are_counted(tmp_path: Path) -> None:
    data = tmp_path / "data"
    degenerate = {"level": "WARN", "code": "degenerate", "detail": "single_call: one model call"}
    run = "run-20261201-100000-dddd"
    _run(
        data,
        run,
        1.0,
        "finished",
        [
            # ok, yet degenerate: trainers skip it all the same
            {"rollout_id": f"{run}.g000r00", "index": 0, "ok": True, "reward": 1.0, "findings": [degenerate]},
            {"rollout_id": f"{run}.g000r01", "index": 1, "ok": True, "reward": 0.0},
            {
                "rollout_id": f"{run}.g000r02",
                "index": 2,
                "ok": False,
                "phase": "failed",
                "error_kind": "no_trainable",
                "error": "a train rollout with no trainable sequence",
                "findings": [degenerate | {"detail": "no_trainable_token: none of 4"}],
            },
        ],
        k=3,
    )
    result = _runs(run, "--data-dir", str(data))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"run {run} finished: 3/3 done, 2 ok, 1 failed, 2 degenerate (skipped by trainers)" in lines
    listed = json.loads(_runs("--data-dir", str(data), "--json").output)
    assert listed["runs"][0]["counts"]["degenerate"] == 2


def test_runs_says_what_is_wrong_with_a_run_it_cannot_show(data: Path) -> None:
    result = _runs("../x", "--data-dir", str(data))
    assert result.exit_code == 2
    assert result.output.strip() == (
        "tapdeck runs: '../x' is not a run id: give a plain id (run-…), not a path"
    )
    result = _runs("run-none", "--data-dir", str(data))
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"tapdeck runs: no run run-none in {data / 'runs'} (pass the --data-dir it ran in)"
    )
    (data / "runs" / "run-20261201-100000-aaaa" / "plan.json").write_text("{not json")
    result = _runs("run-20261201-100000-aaaa", "--data-dir", str(data))
    assert result.exit_code == 1 and "is not a readable plan" in result.output
    result = _runs("--data-dir", str(data))  # the others are still listed, that one named
    assert result.exit_code == 0
    assert "tapdeck runs: warning: run run-20261201-100000-aaaa left out of the list: " in result.output
    assert "run-20261202-100000-bbbb" in result.output


@pytest.mark.medium
def test_runs_says_each_unreadable_run_file_once_as_its_own_warning(data: Path) -> None:
    # A real process: there Python printed the runner's log records bare on stderr, beside the
    # command's own line about the same run (pytest's log capture hides that in-process).
    (data / "runs" / "run-20261201-100000-aaaa" / "plan.json").write_text("{not json")
    results = data / "runs" / "run-20261202-100000-bbbb" / "results.jsonl"
    results.write_text('{"not": "a result"}\n')
    tapdeck = [sys.executable, "-c", "from tapdeck.app.cli import main; main()"]
    listed = subprocess.run(
        [*tapdeck, "runs", "--data-dir", str(data)], capture_output=True, text=True, timeout=60, check=False
    )
    assert listed.returncode == 0
    assert sorted(listed.stderr.splitlines()) == [  # in the order the folder lists the runs
        f"tapdeck runs: warning: {results}:1: not a rollout result (rollout_id: Field required), skipped",
        "tapdeck runs: warning: run run-20261201-100000-aaaa left out of the list: "
        f"{data / 'runs' / 'run-20261201-100000-aaaa' / 'plan.json'} is not a readable plan "
        "(JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 "
        "(char 1))",
    ]
    shown = subprocess.run(
        [*tapdeck, "runs", "run-20261202-100000-bbbb", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0
    assert shown.stderr.splitlines() == [
        f"tapdeck runs: warning: {results}:1: not a rollout result (rollout_id: Field required), skipped"
    ]


def test_runs_in_a_data_dir_without_runs_says_how_to_start_one(tmp_path: Path) -> None:
    result = _runs("--data-dir", str(tmp_path / "none"))
    assert result.exit_code == 0
    assert result.output.strip() == (f"no runs in {tmp_path / 'none' / 'runs'} (tapdeck rollout starts one)")
    assert not (tmp_path / "none").exists()
