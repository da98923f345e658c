"""Training tests: export rows built from recorded vLLM turns, and a scratch data dir.

The rows are produced by the real `tapdeck.proxy.export` functions (RolloutGraph → trace_rows →
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

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proxy_core"))
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def export_file(tmp_path: Path) -> Path:
    """An export JSONL of three groups (see training_data.ROLLOUTS)."""
    from training_data import write_export

    return write_export(tmp_path / "exports" / "r-test.jsonl")


DEAD_ENGINE = "http://127.0.0.1:9/v1"
"""The server's default engine in training tests: never contacted (the recipes bring their own or none)."""


@pytest.fixture
def train_server(tmp_path: Path) -> Iterator[Any]:
    """A full tapdeck server (proxy, store, runner and training routes) on a free loopback port,
    with `.http`, an admin client."""
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.config import ServerConfig

    local = LocalServer(ServerConfig(port=0, data_dir=tmp_path / "data", engine_url=DEAD_ENGINE)).start()
    local.http = httpx.Client(base_url=local.url, timeout=60.0,
                              headers={"Authorization": f"Bearer {local.admin_key}"})
    try:
        yield local
    finally:
        local.http.close()
        local.stop()
