"""Scripts run in the training environment (Python 3.11, CPU torch, trl), as a recipe runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

TRAIN_ENV_SCRIPTS = Path(__file__).resolve().parents[1] / "runner" / "train_env_scripts"
"""The scripts tests run in the training environment."""


def run_in_train_env(python: Path, script: Path, *args: str, timeout_s: float = 900) -> str:
    """Run a script (of TRAIN_ENV_SCRIPTS) in the training environment; its stdout.

    The script sees tapdeck's 3.11-clean modules through the PYTHONPATH link a recipe gets
    (`package_path`, kept beside the environment) and TRL's experimental warning is silenced; a
    failure shows the script's output.
    """
    from tapdeck.runner.training import package_path

    env = {**os.environ, "PYTHONPATH": str(package_path(python.parent.parent.parent / "train-src"))}
    env.update(
        TRL_EXPERIMENTAL_SILENCE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1"
    )
    proc = subprocess.run(
        [str(python), str(script), *args], capture_output=True, text=True, timeout=timeout_s, env=env
    )
    assert proc.returncode == 0, (
        f"{script.name} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    )
    return proc.stdout
