"""The tapdeck HTTP server: `/health`, the admin API, and the model-call routes of every dialect.

Admin routes need `Authorization: Bearer <admin key>`, compared in constant time; the runner's
routes (mounted through `routers=`) use the same `require_admin` dependency. Model calls take the
session key as their API key and are answered in the caller's own dialect.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tapdeck.proxy.model_route import DirectModelCalls
from tapdeck.proxy.service import CallReply, CaptureService
from tapdeck.proxy.sessions import SessionError, SessionSpec

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
EVENTS_KEEPALIVE_S = 15.0


class _JSON(JSONResponse):
    """orjson-encoded JSON; numpy token arrays are written directly (no Python int lists)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def require_admin(request: Request) -> None:
    """FastAPI dependency: the request carries this server's admin key as a Bearer token, else 401."""
    expected: str = request.app.state.admin_key
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), expected.encode()):
        raise HTTPException(401, "admin key required: send `Authorization: Bearer <admin key>` "
                                 "(printed by `tapdeck serve`, stored in <data_dir>/admin.key)",
                            headers={"WWW-Authenticate": "Bearer"})


def _service(request: Request) -> CaptureService:
    return request.app.state.service


def _reply(reply: CallReply) -> Response:
    if reply.stream is not None:
        return StreamingResponse(reply.stream, media_type=reply.media_type, headers=SSE_HEADERS)
    return _JSON(reply.body, status_code=reply.status)


def _admin_router() -> APIRouter:
    router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])

    @router.post("/sessions")
    async def open_session(spec: SessionSpec, request: Request) -> Response:
        info = await _service(request).open_session(spec)
        return _JSON(info.model_dump(mode="json"))

    @router.get("/sessions")
    async def list_sessions(request: Request) -> Response:
        sessions = await asyncio.to_thread(_service(request).list)
        return _JSON({"sessions": [s.model_dump(mode="json") for s in sessions]})

    @router.get("/sessions/{session_id}")
    async def get_session(session_id: str, request: Request) -> Response:
        service = _service(request)
        summary = await asyncio.to_thread(service.get, session_id)
        findings = await asyncio.to_thread(service.findings, session_id)
        return _JSON({**summary.model_dump(mode="json"), "findings": findings})

    @router.get("/sessions/{session_id}/rollout")
    async def rollout(session_id: str, request: Request) -> Response:
        doc = await asyncio.to_thread(_service(request).rollout_document, session_id, lists=False)
        return _JSON(doc)

    @router.get("/sessions/{session_id}/trace")
    async def trace(session_id: str, request: Request) -> Response:
        trace = await asyncio.to_thread(_service(request).training_trace, session_id, lists=False)
        return _JSON(trace)

    @router.get("/sessions/{session_id}/turns/{seq}")
    async def turn(session_id: str, seq: int, request: Request) -> Response:
        return _JSON(await asyncio.to_thread(_service(request).turn_detail, session_id, seq))

    @router.delete("/sessions/{session_id}")
    async def close_session(session_id: str, request: Request) -> Response:
        summary = await _service(request).close_session(session_id)
        return _JSON(summary.model_dump(mode="json"))

    @router.get("/events")
    async def events(request: Request) -> Response:
        return StreamingResponse(_event_stream(_service(request)), media_type="text/event-stream",
                                 headers=SSE_HEADERS)

    return router


async def _event_stream(service: CaptureService) -> AsyncIterator[bytes]:
    """SSE of the event bus; a comment first (so clients see the stream open) and as keepalive."""
    yield b": connected\n\n"
    events = service.events.subscribe()
    next_event = asyncio.ensure_future(anext(events))
    try:
        while True:
            done, _ = await asyncio.wait({next_event}, timeout=EVENTS_KEEPALIVE_S)
            if not done:
                yield b": keepalive\n\n"
                continue
            yield b"data: " + orjson.dumps(next_event.result()) + b"\n\n"
            next_event = asyncio.ensure_future(anext(events))
    finally:
        # The pending `anext` runs inside the generator: it must end before the generator is
        # closed, or aclose() raises "asynchronous generator is already running".
        next_event.cancel()
        await asyncio.wait({next_event})
        await events.aclose()


def create_app(service: CaptureService, *, admin_key: str,
               routers: Sequence[APIRouter] = ()) -> FastAPI:
    """The server's FastAPI app. `routers` are extra (admin-protected by their own dependency) routes."""
    if not admin_key:
        raise ValueError("an admin key is required")
    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await service.aclose()

    app = FastAPI(title="tapdeck", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.service = service
    app.state.admin_key = admin_key
    app.state.instance = secrets.token_hex(8)

    @app.exception_handler(SessionError)
    async def _session_error(_request: Request, exc: SessionError) -> Response:
        return _JSON({"detail": exc.message}, status_code=exc.status)

    @app.get("/health")
    async def health() -> Response:
        return _JSON({"status": "ok", "instance": app.state.instance})

    app.include_router(_admin_router())
    for router in routers:
        app.include_router(router)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return _reply(service.models_listing(request.headers, request.query_params))

    @app.post("/{path:path}")
    async def model_call(path: str, request: Request) -> Response:
        body = await request.body()

        async def until_disconnect() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        reply = await service.handle_call("/" + path, request.query_params, request.headers, body,
                                          until_disconnect)
        return _reply(reply)

    app.add_middleware(DirectModelCalls, endpoint=model_call)
    return app
