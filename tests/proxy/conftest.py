"""Fixtures for the server tests: a tapdeck server in-process, and misbehaving loopback upstreams.

The upstreams are real HTTP servers on loopback whose bodies are the recorded vLLM ones
(tests/fixtures/vllm), so the proxy meets exactly what vLLM sends, plus the failures vLLM can't be
made to produce on demand (HTML bodies, hangs, 5xx).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from tapdeck.app.host import LocalServer
from tapdeck.proxy.config import ServerConfig
from tapdeck.proxy.http.uvicorn_thread import ThreadedServer
from tapdeck.proxy.upstream.tiers import PROBES
from tests.conftest import free_port
from tests.conftest import vllm_error_case as recorded_error
from tests.conftest import vllm_fixture as recorded
from tests.conftest import vllm_reply_to


@dataclass
class Upstream:
    """A loopback vLLM-shaped server whose behaviour a test sets with `mode`."""

    mode: str = "vllm"
    """vllm | no_logprobs | html | slow | context_full | http500 | no_choices | truncated_json |
    empty_503 | long (a reply whose content is `long_chars` characters) | hold_followups (a call
    that continues a conversation, i.e. carries an assistant message, waits while the mode lasts
    or until its client leaves)"""
    delay: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    cancelled: int = 0
    holding: int = 0
    """Calls waiting in `hold_followups` right now."""
    long_chars: int = 2_000_000
    server: ThreadedServer | None = None
    port: int = 0
    """The port it was started on (kept when it stops)."""
    served: list[str] | None = None
    """The model ids `/v1/models` lists (None: the recorded listing's one model)."""

    @property
    def base_url(self) -> str:
        assert self.server is not None
        return f"{self.server.url}/v1"

    def serve_again(self) -> None:
        """Start again on the port the stopped server held, as a restarted vLLM would (this
        process's cached engine probes are kept)."""
        assert self.server is not None
        self.server = ThreadedServer(_upstream_app(self), "127.0.0.1", self.port,
                                     name=self.server.name).start()


def _upstream_app(up: Upstream) -> FastAPI:
    app = FastAPI()
    models = recorded("models")["models"]["response"]
    basic = recorded("chat_basic")["response"]

    @app.get("/v1/models")
    async def list_models() -> Response:
        if up.mode == "html":
            return PlainTextResponse("<html><body>502 Bad Gateway</body></html>", media_type="text/html")
        if up.served is not None:
            entry = models["data"][0]
            return JSONResponse({**models, "data": [{**entry, "id": name, "root": name}
                                                    for name in up.served]})
        return JSONResponse(models)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        up.requests.append(body)
        if up.mode == "slow":
            # uvicorn does not cancel a handler when its client leaves; it has to look.
            deadline = asyncio.get_running_loop().time() + up.delay
            while asyncio.get_running_loop().time() < deadline:
                if await request.is_disconnected():
                    up.cancelled += 1
                    return Response(status_code=499)
                await asyncio.sleep(0.02)
        if up.mode == "hold_followups" and any(
                isinstance(m, dict) and m.get("role") == "assistant" for m in body.get("messages", [])):
            up.holding += 1
            try:
                while up.mode == "hold_followups":
                    if await request.is_disconnected():
                        return Response(status_code=499)
                    await asyncio.sleep(0.05)
            finally:
                up.holding -= 1
        if up.mode == "html":
            return PlainTextResponse("<html><body>502 Bad Gateway</body></html>", media_type="text/html")
        if up.mode == "context_full":
            status, err = recorded_error("prompt_over_context")
            return JSONResponse(err, status_code=status)
        if up.mode == "http500":
            return JSONResponse({"error": {"message": "engine core died", "type": "InternalServerError",
                                           "code": 500}}, status_code=500)
        if up.mode == "no_choices":
            return JSONResponse({"id": "x", "object": "chat.completion", "choices": []})
        if up.mode == "truncated_json":  # a proxy in front cut the body short
            return Response(orjson.dumps(vllm_reply_to(body, basic))[:150], media_type="application/json")
        if up.mode == "empty_503":
            return Response(b"", status_code=503)
        if up.mode == "long":
            reply = vllm_reply_to(body, basic)
            reply["choices"][0]["message"]["content"] = "x" * up.long_chars
            return JSONResponse(reply)
        # "no_logprobs": an engine that ignores the capture fields it was sent.
        return JSONResponse(vllm_reply_to({} if up.mode == "no_logprobs" else body, basic))

    return app


def started_upstream(mode: str = "vllm", name: str = "fake-upstream") -> Upstream:
    """A new upstream on a free port (stop its `.server` when done). A port an earlier test's upstream freed comes back, and this
    process caches engine probes by URL (as a tapdeck process does): an earlier upstream's probe
    (say, a text tier from a `no_logprobs` test) must not answer for this one."""
    PROBES.forget()
    up = Upstream(mode=mode)
    up.server = ThreadedServer(_upstream_app(up), "127.0.0.1", 0, name=name).start()
    up.port = up.server.port
    return up


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    """A fresh loopback upstream per test (started; set `.mode` before calling)."""
    up = started_upstream()
    try:
        yield up
    finally:
        up.server.stop()


@contextlib.contextmanager
def server_with_upstream(data_dir: Path, **overrides: Any) -> Iterator[tuple[Upstream, LocalServer]]:
    """A started upstream and a server using it as its engine, for a module to share."""
    up = started_upstream()
    try:
        server = LocalServer(ServerConfig(host="127.0.0.1", port=0, engine_url=up.base_url,
                                          data_dir=data_dir, **overrides)).start()
        try:
            yield up, server
        finally:
            server.stop()
    finally:
        up.server.stop()


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


TAPDECK = str(Path(sys.executable).with_name("tapdeck"))
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def serve_process(port: int, data: Path, engine_url: str) -> subprocess.Popen:
    """A `tapdeck serve` process on `port` with its data in `data` (stdout and stderr piped)."""
    return subprocess.Popen([TAPDECK, "serve", "--port", str(port), "--data-dir", str(data),
                             "--engine", engine_url], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_health(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until the server answers `/health` (an AssertionError if it exits or never comes up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"tapdeck serve exited: {proc.stderr.read().decode()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("tapdeck serve did not come up")


@contextlib.contextmanager
def running(config: ServerConfig) -> Iterator[tuple[LocalServer, httpx.Client]]:
    """A LocalServer started on `config` (a restart when its data dir was used before), with an
    admin client; both closed at the end."""
    server = LocalServer(config).start()
    try:
        with httpx.Client(base_url=server.url, timeout=60,
                          headers={"Authorization": f"Bearer {server.admin_key}"}) as admin:
            yield server, admin
    finally:
        server.stop()
