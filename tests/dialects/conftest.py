"""Chat replies for the dialect tests, built from recorded vLLM 0.32 bodies (tests/fixtures/vllm/).

A tool-call reply is the recorded `chat_basic` body with its message changed the way vLLM's tool
parser changes it: `content` null, `tool_calls` [{id "chatcmpl-tool-…", type, function{name,
arguments}}], `finish_reason` "tool_calls". A reasoning reply carries vLLM 0.32's `reasoning` key.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tapdeck.proxy.http.app import create_app
from tapdeck.proxy.service import CaptureService
from tapdeck.proxy.http.uvicorn_thread import ThreadedServer, bind_socket
from tapdeck.proxy.store.database import Store
from tapdeck.proxy.upstream.tiers import EngineSpec
from tests.conftest import vllm_fixture, vllm_reply_to


def _recorded(name: str) -> dict[str, Any]:
    return vllm_fixture(name)["response"]


@pytest.fixture
def basic_reply() -> dict[str, Any]:
    """chat_basic: "The capital of France is Paris.", finish stop, prompt 37, completion = ids."""
    return _recorded("chat_basic")


@pytest.fixture
def length_reply() -> dict[str, Any]:
    """chat_length: cut by max_tokens (finish "length")."""
    return _recorded("chat_length")


@pytest.fixture
def tool_reply() -> Callable[..., dict[str, Any]]:
    """A vLLM-shaped tool-call reply; `calls` = [(name, arguments string)]."""

    def make(calls: list[tuple[str, str]] | None = None, *, text: str | None = None) -> dict[str, Any]:
        reply = copy.deepcopy(_recorded("chat_basic"))
        choice = reply["choices"][0]
        choice["message"]["content"] = text
        choice["message"]["tool_calls"] = [
            {"id": f"chatcmpl-tool-{i}abc", "type": "function",
             "function": {"name": name, "arguments": arguments}}
            for i, (name, arguments) in enumerate(calls or [("get_weather", '{"city": "Paris"}')])]
        choice["finish_reason"] = "tool_calls"
        return reply

    return make


@pytest.fixture
def reasoning_reply() -> dict[str, Any]:
    reply = _recorded("chat_basic")
    reply["choices"][0]["message"]["reasoning"] = "France's capital is Paris."
    return reply


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
    server = ThreadedServer(create_app(service, admin_key=admin_key), "127.0.0.1",
                            sock.getsockname()[1]).start(sock=sock)
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60)
    try:
        yield CaptureServer(url=url, admin=admin, store=store)
    finally:
        admin.close()
        server.stop()
        store.close()


@dataclass
class ScriptedUpstream:
    """A loopback vLLM-shaped engine answering with recorded vLLM 0.32 bodies, as a test says.

    `answer(body)` decides each reply: by default the recorded `chat_basic` reply (text "The capital
    of France is Paris."), shaped to the request the way vLLM shapes it. Tests set `answer` to
    return `(status, body)` for errors (bodies in vLLM's recorded error envelope) and `delay` to
    make the engine take its time. Every request body the proxy sent is kept in `requests`.
    """

    url: str = ""
    delay: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    answer: Callable[[dict[str, Any]], tuple[int, dict[str, Any]]] | None = None

    def reply(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.answer is not None:
            return self.answer(body)
        return 200, vllm_reply_to(body, _recorded("chat_basic"))


def vllm_error(status: int, message: str, kind: str = "BadRequestError") -> dict[str, Any]:
    """An error body in vLLM's recorded envelope (tests/fixtures/vllm/errors.json)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def scripted_upstream_app(up: ScriptedUpstream) -> FastAPI:
    """The FastAPI app behind a ScriptedUpstream (models listing = the recorded one)."""
    app = FastAPI()
    models = vllm_fixture("models")["models"]["response"]

    @app.get("/v1/models")
    async def list_models() -> JSONResponse:
        return JSONResponse(models)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        up.requests.append(body)
        if up.delay:
            await asyncio.sleep(up.delay)
        status, reply = up.reply(body)
        return JSONResponse(reply, status_code=status)

    return app


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ScriptedUpstream, CaptureServer]]:
    """A scripted upstream and a capture server in front of it (keepalive every 2 s)."""
    up = ScriptedUpstream()
    server = ThreadedServer(scripted_upstream_app(up), "127.0.0.1", 0, name="scripted-vllm").start()
    up.url = f"{server.url}/v1"
    try:
        with capture_server(EngineSpec(url=up.url), tmp_path_factory.mktemp("capture"),
                            keepalive_s=SCRIPTED_KEEPALIVE_S) as capture:
            yield up, capture
    finally:
        server.stop()


@pytest.fixture
def upstream(scripted: tuple[ScriptedUpstream, CaptureServer]) -> Iterator[ScriptedUpstream]:
    """The scripted upstream, reset to the recorded reply after each test."""
    up = scripted[0]
    yield up
    up.answer, up.delay = None, 0.0
    up.requests.clear()


@pytest.fixture
def capture(scripted: tuple[ScriptedUpstream, CaptureServer]) -> CaptureServer:
    return scripted[1]


SCRIPTED_KEEPALIVE_S = 2.0
"""The hold before a stream starts is one keepalive interval: an engine answering within it
(recorded replies come back in milliseconds) gives the caller its real status. Long enough for a
loaded machine: a dead engine's refusal alone takes ~0.2 s of connect retries, and a stream that
starts before the engine's error reaches the caller as an in-stream error, not a status."""
