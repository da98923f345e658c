"""`tapdeck rollout` runs a batch headless on an in-process server and prints a table of at most 80
columns; in a file (not a terminal) its summary lines are whole lines, and stderr keeps only what
the user needs while the server's own log lines go to the data dir's `rollout.log`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.support.fake_vllm import models_only_engine
from tests.support.session_env import base_env

pytestmark = pytest.mark.slow


def test_rollout_command_runs_a_batch_and_prints_a_table_within_80_columns(
    embedded_engine: Any, tmp_path: Path
) -> None:
    from tapdeck.app.cli import app

    result = CliRunner().invoke(
        app,
        [
            "rollout",
            "--harness",
            "oracle",
            "-n",
            "2",
            "-k",
            "2",
            "-c",
            "2",
            "--timeout",
            "120",
            "--engine",
            embedded_engine.base_url,
            "--data-dir",
            str(tmp_path),
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header_at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("task"))
    table = lines[header_at : header_at + 5]
    assert all(len(line) <= 80 for line in table), table
    assert table[0].split() == ["task", "grp", "#", "reward", "ok", "calls", "atif", "error"]
    rows = [line.split() for line in table[1:]]
    assert [row[3:5] for row in rows] == [["1.00", "yes"]] * 4
    # each group's two rollouts told apart by their index
    assert sorted((row[1], row[2]) for row in rows) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert "4/4 done, 4 ok, 0 failed" in result.stdout
    # The oracle asks no model: the engine's context and output limits never applied.
    assert "ran with: agent 180 s (task) · hard limit 120 s (plan) (no model calls)\n" in result.stdout
    [run_dir] = (tmp_path / "runs").iterdir()
    assert len((run_dir / "results.jsonl").read_text().splitlines()) == 4


def test_rollout_keeps_server_logs_off_stderr_and_summary_lines_whole_in_a_file(tmp_path: Path) -> None:
    tapdeck = Path(sys.executable).parent / "tapdeck"
    data = tmp_path / "data"
    # Every model call fails (the engine only lists models): the proxy logs each 502 and LiteLLM
    # warns about the model's pricing, lines that used to flood stderr.
    with models_only_engine() as engine:
        done = subprocess.run(
            [
                str(tapdeck),
                "rollout",
                "--engine",
                engine,
                "--max-turns",
                "1",
                "--timeout",
                "300",
                "--data-dir",
                str(data),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=base_env(HOME=str(Path.home()), COLUMNS="80"),
        )
    assert done.returncode == 3, done.stderr
    assert "call 502" not in done.stderr and "LiteLLM" not in done.stderr, done.stderr
    assert f"server log: {data / 'rollout.log'}" in done.stderr
    log = (data / "rollout.log").read_text()
    assert "tapdeck.access: call 502 chat" in log and "LiteLLM: register_model" in log
    [ran_with] = [line for line in done.stdout.splitlines() if line.startswith("ran with: ")]
    assert ran_with.endswith("max turns 1 (plan)") and len(ran_with) > 80, done.stdout
    assert any(line.startswith("results: ") for line in done.stdout.splitlines())


def test_rollout_log_records_every_answered_call(embedded_engine: Any, tmp_path: Path) -> None:
    tapdeck = Path(sys.executable).parent / "tapdeck"
    data = tmp_path / "data"
    done = subprocess.run(
        [
            str(tapdeck),
            "rollout",
            "--engine",
            embedded_engine.base_url,
            "--max-turns",
            "1",
            "--max-output-tokens",
            "128",
            "--timeout",
            "300",
            "--data-dir",
            str(data),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=base_env(HOME=str(Path.home()), COLUMNS="80"),
    )
    assert done.returncode in (0, 3), done.stderr  # the tiny model may or may not fail the task
    assert "call 200" not in done.stderr, done.stderr
    # An answered call is an INFO line of the access log: the log has it, not only the failures.
    assert "tapdeck.access: call 200 " in (data / "rollout.log").read_text()


def test_rollout_log_takes_info_lines_only_while_the_run_lasts(tmp_path: Path) -> None:
    import logging

    from tapdeck.app.commands.rollout import _server_logs_to

    access = logging.getLogger("tapdeck.access")
    level = logging.getLogger("tapdeck").level
    with _server_logs_to(tmp_path / "rollout.log"):
        access.info("call 200 openai /v1/chat/completions")
    assert logging.getLogger("tapdeck").level == level
    assert "tapdeck.access: call 200 openai" in (tmp_path / "rollout.log").read_text()
