"""`tapdeck rollout` runs a batch headless on an in-process server and prints an 80-column table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

pytestmark = pytest.mark.slow


def test_rollout_command_runs_a_batch_and_prints_a_table_within_80_columns(
        embedded_engine: Any, tmp_path: Path) -> None:
    from tapdeck.app.cli import app

    result = CliRunner().invoke(app, [
        "rollout", "--harness", "oracle", "-n", "2", "-k", "2", "-c", "2", "--timeout", "120",
        "--engine", embedded_engine.base_url, "--data-dir", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    header = next(line for line in lines if line.lstrip().startswith("task"))
    for column in ("grp", "reward", "ok", "turns", "atif", "error"):
        assert column in header
    rows = [line for line in lines if " 1.00  yes " in line]
    assert len(rows) == 4
    assert "4/4 done, 4 ok, 0 failed" in result.stdout
    [run_dir] = (tmp_path / "runs").iterdir()
    assert len((run_dir / "results.jsonl").read_text().splitlines()) == 4
