"""Fixtures every test can use: the embedded engine, and a dead engine address.

Shared helpers are in tests/support (`from tests.support.vllm_recordings import vllm_fixture`);
nothing imports from a conftest.py.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.ports import free_port

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# Servers started by tests share embedded engines among themselves, never with one running on the
# machine outside the test run (runner/engine/registry.py).
if "TAPDECK_ENGINE_REGISTRY" not in os.environ:
    os.environ["TAPDECK_ENGINE_REGISTRY"] = tempfile.mkdtemp(prefix="tapdeck-test-engines-")
    atexit.register(shutil.rmtree, os.environ["TAPDECK_ENGINE_REGISTRY"], True)


@pytest.fixture
def dead_engine_url() -> str:
    """A loopback engine URL where nothing listens."""
    return f"http://127.0.0.1:{free_port()}/v1"


@pytest.fixture(scope="session")
def embedded_engine() -> Iterator[Any]:
    """The embedded engine (SmolLM2-135M) on a free loopback port, shared by the whole session.

    `.base_url` is `http://127.0.0.1:PORT/v1`, `.served_name` is `"smollm2"`.
    """
    pytest.importorskip("llama_cpp", reason="the embedded engine needs llama-cpp-python")
    from tapdeck.runner.engine.embedded import EmbeddedEngine

    engine = EmbeddedEngine().start()
    try:
        yield engine
    finally:
        engine.stop()
