"""The capture app (proxy routes and admin API, no runner) on loopback, and a module-scoped pair of
it in front of the fake vLLM for tests that share one (fixtures `scripted`, `upstream`, `capture`:
tests/proxy/dialects/conftest.py and tests/runner/test_agent_binaries.py import them to offer them)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tapdeck.proxy.http.server import create_app
from tapdeck.proxy.http.uvicorn_thread import ThreadedServer, bind_socket
from tapdeck.proxy.service import CaptureService
from tapdeck.proxy.store.database import Store
from tapdeck.proxy.upstream.tiers import EngineSpec
from tests.support.fake_vllm import FakeVllm

SCRIPTED_KEEPALIVE_S = 4.0
"""The hold before a stream starts is one keepalive interval: an engine answering within it
(recorded replies come back in milliseconds) gives the caller its real status. Long enough for a
loaded machine: a dead engine's refusal alone takes ~0.2 s of connect retries, a stream that
starts before the engine's error reaches the caller as an in-stream error, not a status, and 2 s
was once too short for the fake engine's instant 400 (load average ~7, the suite on 3 workers)."""


@dataclass
class CaptureServer:
    """A running capture app (proxy routes + admin API) and an admin client for it."""

    url: str
    admin: httpx.Client
    store: Store | None = None
    """The server's store (tests that make it fail reach it here)."""

    def open_session(self, **spec: Any) -> dict[str, Any]:
        reply = self.admin.post("/admin/sessions", json=spec)
        reply.raise_for_status()
        return reply.json()

    def summary(self, session_id: str) -> dict[str, Any]:
        reply = self.admin.get(f"/admin/sessions/{session_id}")
        reply.raise_for_status()
        return reply.json()

    def turn(self, session_id: str, seq: int) -> dict[str, Any]:
        reply = self.admin.get(f"/admin/sessions/{session_id}/turns/{seq}")
        reply.raise_for_status()
        return reply.json()


@contextlib.contextmanager
def capture_server(engine: EngineSpec, data_dir: Path, *, keepalive_s: float) -> Iterator[CaptureServer]:
    """The capture app on a loopback socket bound first, with `engine` as its default engine."""
    admin_key = "dialects-test-admin-key"
    store = Store(data_dir / "capture.db")
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    service = CaptureService(store, default_engine=engine, public_url=url, keepalive_s=keepalive_s)
    server = ThreadedServer(
        create_app(service, admin_key=admin_key), "127.0.0.1", sock.getsockname()[1]
    ).start(sock=sock)
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60)
    try:
        yield CaptureServer(url=url, admin=admin, store=store)
    finally:
        admin.close()
        server.stop()
        store.close()


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeVllm, CaptureServer]]:
    """The fake vLLM and a capture server in front of it (keepalive every 2 s)."""
    with (
        FakeVllm() as up,
        capture_server(
            EngineSpec(url=up.base_url), tmp_path_factory.mktemp("capture"), keepalive_s=SCRIPTED_KEEPALIVE_S
        ) as capture,
    ):
        yield up, capture


@pytest.fixture
def upstream(scripted: tuple[FakeVllm, CaptureServer]) -> Iterator[FakeVllm]:
    """The shared fake vLLM (set `.answer` and `.delay`), reset to the recorded reply after each test."""
    up = scripted[0]
    yield up
    up.answer, up.delay = "chat_basic", 0.0
    up.requests.clear()


@pytest.fixture
def capture(scripted: tuple[FakeVllm, CaptureServer]) -> CaptureServer:
    return scripted[1]
