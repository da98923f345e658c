"""Training tests: export rows built from recorded vLLM turns, and a scratch data dir.

The rows are produced by the real `tapdeck.proxy.export` functions (RolloutGraph → trace_rows →
write_jsonl) from Turns built out of tests/fixtures/vllm bodies, exactly as `tapdeck export RUN` does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proxy_core"))
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def export_file(tmp_path: Path) -> Path:
    """An export JSONL of three groups (see training_data.ROLLOUTS)."""
    from training_data import write_export

    return write_export(tmp_path / "exports" / "r-test.jsonl")


@pytest.fixture(scope="session")
def train_python() -> Path:
    """The training environment's python (Python 3.11, CPU torch, trl 1.16.0, openenv 0.10.0).

    Made by scripts/train-env.sh on first use (minutes, once per machine; cached under
    ~/.cache/tapdeck/train-env), so a fresh CI machine builds it here.
    """
    from tapdeck.runner.train_env import ensure_python

    return ensure_python()


def run_in_train_env(python: Path, script: Path, *args: str, timeout_s: float = 900) -> str:
    """Run a script of tests/training/train_env_scripts in the training environment; its stdout.

    The script sees tapdeck's 3.11-clean modules through `recipe_env()` and TRL's experimental
    warning is silenced; a failure shows the script's output.
    """
    import subprocess

    from tapdeck.runner.train_env import recipe_env

    env = recipe_env()
    env.update(TRL_EXPERIMENTAL_SILENCE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1")
    proc = subprocess.run([str(python), str(script), *args], capture_output=True, text=True,
                          timeout=timeout_s, env=env)
    assert proc.returncode == 0, f"{script.name} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return proc.stdout
