"""Fake vLLM engines answering with the recorded vLLM 0.32 bodies (tests/fixtures/vllm)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from tapdeck.proxy.http.uvicorn_thread import ThreadedServer
from tapdeck.proxy.upstream.tiers import PROBES
from tests.support.vllm_recordings import vllm_error_case, vllm_fixture, vllm_reply_to


@contextlib.contextmanager
def models_only_engine(path: str = "/v1") -> Iterator[str]:
    """A loopback server answering only `GET {path}/models`, with the recorded vLLM listing: an
    engine address that settles, whose model calls fail. Yields `http://127.0.0.1:PORT` (no path)."""
    listing = vllm_fixture("models")["models"]["response"]
    app = FastAPI()
    app.get(f"{path}/models")(lambda: listing)
    server = ThreadedServer(app, "127.0.0.1", 0, name="models-only-engine").start()
    try:
        yield server.url
    finally:
        server.stop()


@contextlib.contextmanager
def hanging_engine(hold_s: float = 600.0) -> Iterator[Any]:
    """A loopback vLLM-shaped engine that probes fine (the recorded listing; one-token probe calls
    get the recorded reply) and never answers any other call: each is held until its client hangs
    up or `hold_s` passes. Yields it with `.base_url` (`…/v1`), `.served_name` and `.held` (calls
    held now)."""
    import types

    listing = vllm_fixture("models")["models"]["response"]
    basic = vllm_fixture("chat_basic")["response"]
    state = types.SimpleNamespace(held=0, base_url="", served_name=listing["data"][0]["id"])
    app = FastAPI()
    app.get("/v1/models")(lambda: listing)

    async def chat(request):  # a plain Starlette route: the annotations here are strings
        body = await request.json()
        if body.get("max_tokens") == 1:
            return JSONResponse(vllm_reply_to(body, basic))
        state.held += 1
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + hold_s
            while loop.time() < deadline and not await request.is_disconnected():
                await asyncio.sleep(0.05)
        finally:
            state.held -= 1
        return Response(status_code=499)

    app.router.add_route("/v1/chat/completions", chat, methods=["POST"])
    server = ThreadedServer(app, "127.0.0.1", 0, name="hanging-engine").start()
    state.base_url = f"{server.url}/v1"
    try:
        yield state
    finally:
        server.stop()


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
    models = vllm_fixture("models")["models"]["response"]
    basic = vllm_fixture("chat_basic")["response"]

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
            status, err = vllm_error_case("prompt_over_context")
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
        return 200, vllm_reply_to(body, vllm_fixture("chat_basic")["response"])


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


def vllm_refusal(body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """The refusal real vLLM 0.32 gives this body (recorded), or None if it would accept it."""
    if body.get("model") != "smollm2":
        return vllm_error_case("unknown_model")
    if body.get("tools") == []:
        return vllm_error_case("empty_tools")
    if "stream_options" in body and not body.get("stream"):
        return vllm_error_case("stream_options_without_stream")
    if (body.get("max_tokens") or 0) > 2048:
        return vllm_error_case("max_tokens_over_context")
    if body.get("top_logprobs") is not None and not body.get("logprobs"):
        return vllm_error_case("top_logprobs_without_logprobs")
    if (body.get("top_logprobs") or 0) > 20:
        return vllm_error_case("top_logprobs_too_large")
    return None


class RecordedUpstream:
    """httpx transport answering like the recorded vLLM server; records what it was sent."""

    def __init__(self, reply: Callable[[dict[str, Any]], tuple[int, Any]] | str = "chat_basic",
                 models: dict[str, Any] | None = None) -> None:
        self.reply = reply
        self.models = models if models is not None else vllm_fixture("models")["models"]["response"]
        self.requests: list[httpx.Request] = []
        self.bodies: list[dict[str, Any]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if request.method == "GET" and path.endswith("/models"):
            return httpx.Response(200, json=self.models)
        if request.method == "POST" and path.endswith("/chat/completions"):
            body = json.loads(request.content)
            self.bodies.append(body)
            refusal = vllm_refusal(body)
            if refusal is not None:
                return httpx.Response(refusal[0], json=refusal[1])
            if callable(self.reply):
                status, payload = self.reply(body)
            else:
                status, payload = 200, vllm_fixture(self.reply)["response"]
            if isinstance(payload, (bytes, str)):
                return httpx.Response(status, content=payload, headers={"content-type": "text/html"})
            return httpx.Response(status, json=payload)
        return httpx.Response(404, json={"detail": "Not Found"})

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handler))
