"""The test session's environment (tests/support/session_env.py), and the fixtures tests of several
folders use: engines (the embedded one, a fake vLLM per test, a dead address) and tapdeck servers
in this process.

Shared helpers are in tests/support (`from tests.support.vllm_recordings import vllm_fixture`);
nothing imports from a conftest.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fake_vllm import FakeVllm, models_only_engine
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


@pytest.fixture
def upstream() -> Iterator[FakeVllm]:
    """A fresh fake vLLM on loopback per test (started; set `.fault`, `.delay` or `.hold` before
    calling)."""
    with FakeVllm() as up:
        yield up


@pytest.fixture
def port_factory() -> Any:
    """`port_factory()` → a loopback port nobody holds right now."""
    return free_port


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Any]:
    """`make_server(engine_url, **config)` → a started LocalServer on a free port (stopped at the end)."""
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.config import ServerConfig

    started: list[LocalServer] = []

    def make(engine_url: str, **overrides: Any) -> LocalServer:
        fields = {
            "host": "127.0.0.1",
            "port": 0,
            "data_dir": tmp_path / "data",
            "engine_url": engine_url,
            **overrides,
        }
        server = LocalServer(ServerConfig(**fields)).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def admin_for() -> Iterator[Any]:
    """`admin_for(server)` → a sync httpx client carrying the server's admin key."""
    clients: list[httpx.Client] = []

    def make(server: Any) -> httpx.Client:
        client = httpx.Client(
            base_url=server.url, timeout=120, headers={"Authorization": f"Bearer {server.admin_key}"}
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def train_server(tmp_path: Path) -> Iterator[Any]:
    """A full tapdeck server (proxy, store, runner and training routes) on a free loopback port,
    with `.http`, an admin client."""
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.config import ServerConfig

    # The server's default engine only has to settle at start: the recipes bring their own or none.
    with models_only_engine() as engine:
        local = LocalServer(ServerConfig(port=0, data_dir=tmp_path / "data", engine_url=engine)).start()
    local.http = httpx.Client(
        base_url=local.url, timeout=60.0, headers={"Authorization": f"Bearer {local.admin_key}"}
    )
    try:
        yield local
    finally:
        local.http.close()
        local.stop()
