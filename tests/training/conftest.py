"""Training tests: export rows built from recorded vLLM turns, and a scratch data dir.

The rows are produced by the real `tapdeck.proxy.capture.export` functions (RolloutGraph → trace_rows →
write_jsonl) from Turns built out of tests/fixtures/vllm bodies, exactly as `tapdeck export RUN` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fake_vllm import models_only_engine
from tests.support.training_export import write_export


@pytest.fixture
def export_file(tmp_path: Path) -> Path:
    """An export JSONL of three groups (see tests.support.training_export.ROLLOUTS)."""
    return write_export(tmp_path / "exports" / "r-test.jsonl")


@pytest.fixture(scope="session")
def train_python() -> Path:
    """The training environment's python (Python 3.11, CPU torch, trl 1.16.0, openenv 0.10.0).

    Made by scripts/train-env.sh on first use (minutes, once per machine; cached under
    ~/.cache/tapdeck/train-env), so a fresh CI machine builds it here.
    """
    from tapdeck.runner.train_env import ensure_python

    return ensure_python()


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
