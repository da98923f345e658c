"""The tapdeck HTTP server: `/health`, the admin API, and the model-call routes of every dialect.

Admin routes need `Authorization: Bearer <admin key>`, compared in constant time; the runner's
routes (mounted through `routers=`) use the same `require_admin` dependency, and the admin key is
also checked before an admin request's body is read. Model calls take the session key as their API
key and are answered in the caller's own dialect. Bodies are capped (`max_body_bytes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from functools import partial
from typing import Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from tapdeck.proxy.capture.policy_stamp import MAX_LABEL_CHARS, policy_version
from tapdeck.proxy.config import DEFAULT_MAX_BODY_BYTES
from tapdeck.proxy.errors import ProxyError
from tapdeck.proxy.http.error_reply import error_response
from tapdeck.proxy.http.limits import ADMIN_KEY_REQUIRED, GuardedBodies, read_body
from tapdeck.proxy.http.model_route import ModelCallsFirst
from tapdeck.proxy.service import CallReply, CaptureService
from tapdeck.proxy.sessions.spec import SessionSpec
from tapdeck.proxy.store.no_follow import LinkRefused
from tapdeck.schema.activity import SessionActivity
from tapdeck.schema.sessions import (
    EngineVersionPost,
    EngineVersions,
    GraphView,
    Health,
    RolloutDocument,
    SessionDetail,
    SessionInfo,
    SessionList,
    SessionSummary,
    TrainingTrace,
    TurnDetail,
)

CATCH_ALL = "/{path:path}"
"""The model-call route (POST) and the fallback for other GETs."""

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
EVENTS_KEEPALIVE_S = 15.0


class _JSON(JSONResponse):
    """orjson-encoded JSON; numpy token arrays are written directly (no Python int lists)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def _is_admin(authorization: str | None, expected: str) -> bool:
    """Whether an `Authorization` header carries the admin key (compared in constant time)."""
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), expected.encode())


def require_admin(request: Request) -> None:
    """FastAPI dependency: the request carries this server's admin key as a Bearer token, else 401."""
    if not _is_admin(request.headers.get("authorization"), request.app.state.admin_key):
        raise HTTPException(401, ADMIN_KEY_REQUIRED, headers={"WWW-Authenticate": "Bearer"})


def _service(request: Request) -> CaptureService:
    service: CaptureService = request.app.state.service  # set by create_app
    return service


def _reply(reply: CallReply) -> Response:
    if reply.stream is not None:
        return StreamingResponse(reply.stream, media_type=reply.media_type, headers=SSE_HEADERS)
    return _JSON(reply.body, status_code=reply.status, headers=reply.headers)


def _admin_router() -> APIRouter:
    router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])

    @router.post("/sessions", response_model=SessionInfo)
    async def open_session(spec: SessionSpec, request: Request) -> Response:
        info = await _service(request).open_session(spec)
        return _JSON(info.model_dump(mode="json"))

    @router.get("/sessions", response_model=SessionList)
    async def list_sessions(request: Request) -> Response:
        sessions = await asyncio.to_thread(_service(request).list)
        return _JSON({"sessions": [s.model_dump(mode="json") for s in sessions]})

    @router.get("/sessions/{session_id}", response_model=SessionDetail)
    async def get_session(session_id: str, request: Request) -> Response:
        service = _service(request)
        summary = await asyncio.to_thread(service.get, session_id)
        findings = await asyncio.to_thread(service.findings, session_id)
        return _JSON(SessionDetail(**dict(summary), findings=findings).model_dump(mode="json"))

    @router.get("/sessions/{session_id}/rollout", response_model=RolloutDocument)
    async def rollout(session_id: str, request: Request) -> Response:
        doc = await asyncio.to_thread(_service(request).rollout_document, session_id, lists=False)
        return _JSON(doc)

    @router.get("/sessions/{session_id}/graph", response_model=GraphView)
    async def graph(session_id: str, request: Request, since: int = 0) -> Response:
        return _JSON(await asyncio.to_thread(_service(request).graph_view, session_id, max(0, since)))

    @router.get("/sessions/{session_id}/trace", response_model=TrainingTrace)
    async def trace(session_id: str, request: Request) -> Response:
        trace = await asyncio.to_thread(_service(request).training_trace, session_id, lists=False)
        return _JSON(trace)

    @router.get("/sessions/{session_id}/turns/{seq}", response_model=TurnDetail)
    async def turn(session_id: str, seq: int, request: Request) -> Response:
        return _JSON(await asyncio.to_thread(_service(request).turn_detail, session_id, seq))

    @router.get("/sessions/{session_id}/activity", response_model=SessionActivity)
    async def activity(session_id: str, request: Request) -> Response:
        service = _service(request)
        # An unknown session is a 404 like the other session routes. A lookup, not `get`: a
        # summary may load a restarted session's graph, on this (the calls') loop.
        service.registry.lookup(session_id)
        return _JSON(service.activity.snapshot(session_id).model_dump(mode="json"))

    @router.delete("/sessions/{session_id}", response_model=SessionSummary)
    async def close_session(session_id: str, request: Request) -> Response:
        summary = await _service(request).close_session(session_id)
        return _JSON(summary.model_dump(mode="json"))

    @router.get("/engines/version", response_model=EngineVersions)
    async def engine_versions(request: Request) -> Response:
        return _JSON(_service(request).registry.versions.listing().model_dump(mode="json"))

    @router.post("/engines/version", response_model=EngineVersions)
    async def post_engine_version(request: Request) -> Response:
        post = _version_post(await request.body())
        listing = _service(request).registry.versions.post(post.version, post.engine)
        return _JSON(listing.model_dump(mode="json"))

    @router.get("/events")
    async def events(request: Request) -> Response:
        return StreamingResponse(
            _event_stream(_service(request)), media_type="text/event-stream", headers=SSE_HEADERS
        )

    return router


def _version_post(raw: bytes) -> EngineVersionPost:
    """The body of `POST /admin/engines/version`, or a 400 saying what is wrong with it."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProxyError(400, f"the body is not JSON: {exc}", retryable=False) from None
    if not isinstance(body, dict):
        raise ProxyError(
            400, 'the body must be a JSON object: {"version": N, "engine": URL}', retryable=False
        )
    if (unknown := sorted(set(body) - set(EngineVersionPost.model_fields))) != []:
        raise ProxyError(
            400, f"unknown field(s) {', '.join(unknown)}: give version and engine", retryable=False
        )
    version = policy_version(body.get("version"))
    if version is None:
        raise ProxyError(
            400,
            f"`version` must be a step number (an int ≥ 0) or a label of at most {MAX_LABEL_CHARS} "
            f"characters, not {body.get('version')!r}",
            retryable=False,
        )
    engine = body.get("engine")
    if engine is not None and not (isinstance(engine, str) and engine.startswith(("http://", "https://"))):
        raise ProxyError(400, f"`engine` must be an http(s) URL or null, not {engine!r}", retryable=False)
    return EngineVersionPost(version=version, engine=engine)


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
            try:
                event = next_event.result()
            except StopAsyncIteration:
                return  # the bus closed (shutdown): ending the stream lets the server stop cleanly
            yield b"data: " + orjson.dumps(event) + b"\n\n"
            next_event = asyncio.ensure_future(anext(events))
    finally:
        # The pending `anext` runs inside the generator: it must end before the generator is
        # closed, or aclose() raises "asynchronous generator is already running".
        next_event.cancel()
        await asyncio.wait({next_event})
        await events.aclose()


def create_app(
    service: CaptureService,
    *,
    admin_key: str,
    routers: Sequence[APIRouter] = (),
    exception_handlers: Mapping[type[Exception], Callable[..., Any]] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The server's FastAPI app. `routers` are extra (admin-protected by their own dependency) routes;
    `exception_handlers` answer the errors they raise (the proxy does not know the runner's).

    No request body is read before its key is checked, nor past `max_body_bytes`."""
    if not admin_key:
        raise ValueError("an admin key is required")

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await service.aclose()

    app = ModelCallsFirst(title="tapdeck", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.service = service
    app.state.admin_key = admin_key
    app.state.instance = secrets.token_hex(8)

    def admin_ok(scope: Any) -> bool:
        return _is_admin(Headers(scope=scope).get("authorization"), admin_key)

    app.add_middleware(GuardedBodies, limit=max_body_bytes, admin_ok=admin_ok)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's own handler echoes each error's input, and fails on a body that is not UTF-8.
        return _JSON(
            {
                "detail": [
                    {"type": e.get("type"), "loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg")}
                    for e in exc.errors()
                ],
                "kind": "invalid_request_error",
                "retryable": False,
            },
            status_code=422,
            headers={"x-should-retry": "false"},
        )

    @app.exception_handler(ProxyError)
    async def _proxy_error(request: Request, exc: ProxyError) -> Response:
        return error_response(request.url.path, exc)

    @app.exception_handler(LinkRefused)
    async def _link_refused(request: Request, exc: LinkRefused) -> Response:
        # A file this server would write (an export, a run's record) is a symbolic link: the line
        # naming it, where a bare 500 would say nothing.
        return error_response(request.url.path, ProxyError(500, str(exc), retryable=False))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # Routes' own refusals (a missing run) in the same shape as every other error: under
        # /admin `kind` and `retryable` beside FastAPI's `detail`; elsewhere (an unknown path or
        # method) the chat-completions envelope, as a model call's path of no dialect gets.
        error = exc if isinstance(exc, ProxyError) else ProxyError(exc.status_code, str(exc.detail))
        response = error_response(request.url.path, error)
        response.headers.update(exc.headers or {})
        return response

    @app.get("/health", response_model=Health)
    async def health(request: Request) -> Response:
        wait = service.default_engine.waiting()
        if wait is not None and not _is_admin(request.headers.get("authorization"), app.state.admin_key):
            # /health asks no key: where the engine is (an address inside the cluster) is the
            # admin's to know; that the server waits, and how long, is anyone's.
            wait = wait.model_copy(update={"url": None})
        return _JSON(
            {
                "status": "ok",
                "instance": app.state.instance,
                "engine_wait": wait.model_dump() if wait is not None else None,
            }
        )

    app.include_router(_admin_router())
    for router in routers:
        app.include_router(router)
    for error, handler in (exception_handlers or {}).items():
        app.add_exception_handler(error, handler)

    # The session's one model, in the asking SDK's shape (proxy/http/model_listing.py). A model id
    # may hold slashes (`Qwen/Qwen3-8B`), hence `:path`.
    @app.get("/v1/models")
    @app.get("/v1beta/models")
    async def models(request: Request) -> Response:
        return _reply(service.models(request.url.path, request.headers, request.query_params))

    @app.get("/v1/models/{model_id:path}")
    @app.get("/v1beta/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> Response:
        return _reply(service.models(request.url.path, request.headers, request.query_params, model_id))

    @app.get(CATCH_ALL)
    async def other_get(path: str, request: Request) -> Response:
        # Model-call paths are matched case-insensitively, so the models routes are too; any
        # other GET is a 404 naming what answers GET (the POST route below made it a 405).
        lowered = path.lower()
        for root in ("v1/models", "v1beta/models"):
            if lowered == root:
                return await models(request)
            if lowered.startswith(root + "/"):
                return await model(path[len(root) + 1 :], request)
        if lowered.startswith("admin/"):  # an admin route that takes other methods is a 405
            allowed = [
                method
                for method in ("DELETE", "POST")
                if any(
                    route.matches({**request.scope, "method": method})[0] is Match.FULL
                    for route in app.router.routes
                    if getattr(route, "path", None) != CATCH_ALL
                )
            ]
            if allowed:
                raise StarletteHTTPException(405, headers={"Allow": ", ".join(allowed)})
        raise ProxyError(
            404,
            f"nothing answers GET /{path}: GET serves /health, /v1/models[/ID] "
            "and /v1beta/models[/MODEL]; model calls are POSTs, admin routes are "
            "under /admin",
        )

    @app.post(CATCH_ALL)
    async def model_call(path: str, request: Request) -> Response:
        async def until_disconnect() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        # The body is read by the service once the session key is known good.
        reply = await service.handle_call(
            "/" + path,
            request.query_params,
            request.headers,
            partial(read_body, request, max_body_bytes),
            until_disconnect,
        )
        return _reply(reply)

    app.model_call_endpoint = model_call
    return app
