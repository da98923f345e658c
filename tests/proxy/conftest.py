"""Fixtures for the server tests: a tapdeck server in-process, and a fake vLLM on loopback per test.

The fake (tests/support/fake_vllm.py) answers with the recorded vLLM bodies (tests/fixtures/vllm),
so the proxy meets exactly what vLLM sends, plus the failures vLLM can't be made to produce on
demand (HTML bodies, hangs, 5xx).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tapdeck.app.host import LocalServer
from tapdeck.proxy.config import ServerConfig
from tests.support.fake_vllm import FakeVllm
from tests.support.ports import free_port


@pytest.fixture
def upstream() -> Iterator[FakeVllm]:
    """A fresh fake vLLM per test (started; set `.fault`, `.delay` or `.hold` before calling)."""
    with FakeVllm() as up:
        yield up


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Any]:
    """`make_server(engine_url, **config)` → a started LocalServer on a free port (stopped at the end)."""
    started: list[LocalServer] = []

    def make(engine_url: str, **overrides: Any) -> LocalServer:
        fields = {"host": "127.0.0.1", "port": 0, "data_dir": tmp_path / "data",
                  "engine_url": engine_url, **overrides}
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

    def make(server: LocalServer) -> httpx.Client:
        client = httpx.Client(base_url=server.url, timeout=120,
                              headers={"Authorization": f"Bearer {server.admin_key}"})
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def port_factory() -> Any:
    """`port_factory()` → a loopback port nobody holds right now."""
    return free_port
