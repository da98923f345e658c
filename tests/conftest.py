"""The test session's environment (tests/support/session_env.py), and fixtures every test can use:
the embedded engine, and a dead engine address.

Shared helpers are in tests/support (`from tests.support.vllm_recordings import vllm_fixture`);
nothing imports from a conftest.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.ports import free_port
from tests.support.session_env import apply_session_env, isolate_engine_registry

# Before any test module is imported (some import Harbor, and with it litellm, at their top).
apply_session_env()
isolate_engine_registry()


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
