"""`tapdeck rollout`'s exit codes, as `--help` and the README state them: 0 every rollout ok, 1 the
run could not be run, 2 bad usage (an unknown option or a plan the server refused), 3 the run ended
with some rollout not ok."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.app.commands.rollout import (
    EXIT_COULD_NOT_RUN,
    EXIT_ROLLOUT_FAILED,
    EXIT_USAGE,
)
from tests.conftest import models_only_engine
from tests.runner.conftest import make_task


def test_rollout_help_states_every_exit_code() -> None:
    result = CliRunner().invoke(app, ["rollout", "--help"], env={"COLUMNS": "100", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for needle in ("Exit codes: 0 every rollout ok", "1 the run could not be run",
                   "2 bad usage", "3 the run ended with some rollout not ok"):
        assert needle in text, needle


def test_an_unknown_option_exits_2() -> None:
    assert CliRunner().invoke(app, ["rollout", "--no-such-flag"]).exit_code == EXIT_USAGE


def test_no_engine_answering_exits_1(tmp_path: Path, dead_engine_url: str) -> None:
    result = CliRunner().invoke(app, ["rollout", "--engine", dead_engine_url, "--data-dir",
                                      str(tmp_path)])
    assert result.exit_code == EXIT_COULD_NOT_RUN, result.output
    assert f"tried GET {dead_engine_url}/models" in result.output


def test_a_plan_the_server_refuses_exits_2(tmp_path: Path) -> None:
    with models_only_engine() as engine:
        result = CliRunner().invoke(app, ["rollout", "--engine", engine, "--harness", "no-such-harness",
                                          "--data-dir", str(tmp_path)])
    assert result.exit_code == EXIT_USAGE, result.output
    assert "no-such-harness" in result.output


@pytest.mark.slow
def test_a_failed_rollout_exits_3_and_the_table_says_why(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks", "no-reward", "echo 'this verifier writes no reward'\n")
    with models_only_engine() as engine:
        result = CliRunner().invoke(app, [
            "rollout", "--dataset", str(task), "--harness", "oracle", "--timeout", "120",
            "--engine", engine.removeprefix("http://"), "--data-dir", str(tmp_path / "data")],
            env={"COLUMNS": "100"})
    assert result.exit_code == EXIT_ROLLOUT_FAILED, result.output
    assert f"engine {engine}/v1" in result.output
    assert "verifier_failed" in result.output and "0 ok, 1 failed" in result.output
