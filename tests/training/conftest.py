"""Training tests: export rows built from recorded vLLM turns, and a scratch data dir.

The rows are produced by the real `tapdeck.proxy.capture.export` functions (RolloutGraph → trace_rows →
write_jsonl) from Turns built out of tests/fixtures/vllm bodies, exactly as `tapdeck export RUN` does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import models_only_engine

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

    The script sees tapdeck's 3.11-clean modules through the PYTHONPATH link a recipe gets
    (`package_path`, kept beside the environment) and TRL's experimental warning is silenced; a
    failure shows the script's output.
    """
    import os
    import subprocess

    from tapdeck.runner.training import package_path

    env = {**os.environ, "PYTHONPATH": str(package_path(python.parent.parent.parent / "train-src"))}
    env.update(TRL_EXPERIMENTAL_SILENCE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1")
    proc = subprocess.run([str(python), str(script), *args], capture_output=True, text=True,
                          timeout=timeout_s, env=env)
    assert proc.returncode == 0, f"{script.name} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return proc.stdout


@pytest.fixture
def train_server(tmp_path: Path) -> Iterator[Any]:
    """A full tapdeck server (proxy, store, runner and training routes) on a free loopback port,
    with `.http`, an admin client."""
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.config import ServerConfig

    # The server's default engine only has to settle at start: the recipes bring their own or none.
    with models_only_engine() as engine:
        local = LocalServer(ServerConfig(port=0, data_dir=tmp_path / "data", engine_url=engine)).start()
    local.http = httpx.Client(base_url=local.url, timeout=60.0,
                              headers={"Authorization": f"Bearer {local.admin_key}"})
    try:
        yield local
    finally:
        local.http.close()
        local.stop()
