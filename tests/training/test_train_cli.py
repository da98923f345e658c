"""`tapdeck train` through the real console script."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from training_data import write_export

TAPDECK = shutil.which("tapdeck", path=str(Path(os.sys.executable).parent)) or "tapdeck"
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def test_train_list_says_where_each_recipe_runs_and_that_none_trains_on_cpu() -> None:
    out = subprocess.run([TAPDECK, "train", "--list"], capture_output=True, text=True, timeout=60, env=ENV)
    assert out.returncode == 0, out.stderr
    assert "data-check  [can start here]" in out.stdout
    assert "grpo-trl  [cannot start here (missing:" in out.stdout
    assert "No recipe that runs on a CPU machine here updates the model's weights" in out.stdout


def test_train_streams_the_log_and_prints_final_metrics(tmp_path: Path) -> None:
    rows = write_export(tmp_path / "rows.jsonl")
    out = subprocess.run([TAPDECK, "train", "--data-dir", str(tmp_path / "data"), "--rows", str(rows)],
                         capture_output=True, text=True, timeout=120, env=ENV)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "step 2: group 2" in out.stdout and "\x1b[" not in out.stdout
    assert "  train/reward = 0.5 (step 2)" in out.stdout
    assert "finished (exit code 0)" in out.stdout


def test_train_on_an_unknown_run_is_a_clear_error(tmp_path: Path) -> None:
    out = subprocess.run([TAPDECK, "train", "--data-dir", str(tmp_path), "--run", "r-missing"],
                         capture_output=True, text=True, timeout=60, env=ENV)
    assert out.returncode == 1 and "no run 'r-missing'" in out.stderr
