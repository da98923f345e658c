"""One harness request, from its path and key to the reply in its own dialect.

Detect the dialect by path → check the session key → read and parse the body → hand the call to
`CallCapture` (engine call, recorded turn) → render the reply in the caller's dialect, or hold a
stream open with keepalives until the engine answers. Token-count routes are answered here without
becoming a turn. Every request, refused ones included, writes one access-log line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import Any

import httpx
import orjson

from tapdeck.proxy.capture.call import CallCapture
from tapdeck.proxy.dialects import detect
from tapdeck.proxy.dialects.anthropic import DIALECT as ANTHROPIC
from tapdeck.proxy.dialects.arguments import arguments_memo
from tapdeck.proxy.dialects.base import Dialect, DialectError, DialectRequest, SSEEvent
from tapdeck.proxy.dialects.chat import DIALECT as CHAT
from tapdeck.proxy.dialects.google import DIALECT as GOOGLE
from tapdeck.proxy.dialects.google import JSON_ARRAY
from tapdeck.proxy.dialects.responses import DIALECT as RESPONSES
from tapdeck.proxy.errors import ProxyError
from tapdeck.proxy.http.access_log import CURRENT_CALL, AccessRecord
from tapdeck.proxy.http.call_reply import CallReply, finish_reason, logged, unless_disconnected
from tapdeck.proxy.http.error_reply import render_error, render_stream_error
from tapdeck.proxy.http.limits import MALFORMED, MAX_JSON_DEPTH, malformed_message, too_deep
from tapdeck.proxy.http.model_listing import ServedModel, listing, lookup
from tapdeck.proxy.http.sse import KEEPALIVE, json_array_with_keepalive, stream_with_keepalive
from tapdeck.proxy.http.token_counts import aux_dialect, count_tokens, match_aux
from tapdeck.proxy.sessions.keys import key_from_request
from tapdeck.proxy.sessions.live import LiveSession
from tapdeck.proxy.sessions.registry import SessionRegistry

log = logging.getLogger("tapdeck.proxy")

SESSION_HEADER = "x-session-id"
"""opencode's own session header: recorded in turn meta, never used for routing."""


class CallPipeline:
    """Answers model-call requests of every dialect for the registry's open sessions."""

    def __init__(self, registry: SessionRegistry, capture: CallCapture, *, keepalive_s: float) -> None:
        self.registry = registry
        self.capture = capture
        self.keepalive_s = keepalive_s
        self._aux_http: httpx.AsyncClient | None = None

    async def aclose(self) -> None:
        """Close the connection pool token counts are asked on."""
        if self._aux_http is not None:
            await self._aux_http.aclose()
            self._aux_http = None

    def models(
        self, path: str, headers: Mapping[str, str], query: Mapping[str, str], model_id: str | None = None
    ) -> CallReply:
        """A models route with a session key (`GET /v1/models[/{id}]`, `/v1beta/models[/{model}]`):
        the list, or the model `model_id`, holding the session's model only, in the shape of the
        SDK asking (proxy/http/model_listing.py)."""
        dialect = _models_dialect(path, headers, query)
        session = self.registry.for_key(key_from_request(headers, query))
        if session is None:
            return render_error(dialect, ProxyError(401, "unknown or closed session key"))
        served = ServedModel(id=session.served_model or "model", created=session.record["created_at"])
        return listing(dialect, served) if model_id is None else lookup(dialect, served, model_id)

    async def handle_call(
        self,
        path: str,
        query: Mapping[str, str],
        headers: Mapping[str, str],
        body: bytes | Callable[[], Awaitable[bytes]],
        until_disconnect: Callable[[], Awaitable[None]] | None = None,
    ) -> CallReply:
        """Answer one harness request (any dialect); see the module docstring for the flow.

        `body` is the request body, or what reads it: then it is read only once the session key
        is known good, and its BodyTooLarge / BodyIncomplete are answered in the caller's dialect.

        `until_disconnect` completes when the client hangs up; the call is then cancelled (a
        stream that has started is cancelled by the HTTP layer stopping it). Every call, refused
        ones included, writes one access-log line (a stream's when it ends).
        """
        access = AccessRecord(path=path)
        token = CURRENT_CALL.set(access)
        try:
            reply = await self._handle(path, query, headers, body, until_disconnect, access)
        finally:
            CURRENT_CALL.reset(token)
        if reply.stream is None:
            access.status = reply.status
            access.error = access.error or reply.kind
            access.emit()
        else:
            reply.stream = logged(reply.stream, access)
        return reply

    async def _handle(
        self,
        path: str,
        query: Mapping[str, str],
        headers: Mapping[str, str],
        body: bytes | Callable[[], Awaitable[bytes]],
        until_disconnect: Callable[[], Awaitable[None]] | None,
        access: AccessRecord,
    ) -> CallReply:
        aux_kind = match_aux("POST", path)
        dialect = aux_dialect(aux_kind) if aux_kind else detect(path)
        if dialect is None:
            return render_error(CHAT, ProxyError(404, f"tapdeck does not serve POST {path}"))
        access.dialect = dialect.name
        try:
            session = self.registry.for_key(key_from_request(headers, query))
            if session is None:
                raise ProxyError(
                    401,
                    "unknown or closed session key: use the api_key tapdeck "
                    "returned when the session was opened",
                )
            access.session_id = session.id
            payload = _payload(body if isinstance(body, bytes) else await body())
            if aux_kind:
                return await self._aux(session, aux_kind, payload)
            with arguments_memo(session.arguments):
                return await self._model_call(
                    session, dialect, path, query, headers, payload, until_disconnect, access
                )
        except ProxyError as exc:  # every refusal, in the caller's own dialect
            return render_error(dialect, exc)
        except Exception as exc:  # noqa: BLE001 - a tapdeck bug: still an answer the caller's SDK can read
            return render_error(dialect, _internal_error(exc, access))

    async def _model_call(
        self,
        session: LiveSession,
        dialect: Dialect,
        path: str,
        query: Mapping[str, str],
        headers: Mapping[str, str],
        payload: dict[str, Any],
        until_disconnect: Callable[[], Awaitable[None]] | None,
        access: AccessRecord,
    ) -> CallReply:
        remember: Callable[[dict[str, Any]], None] | None = None
        try:
            if dialect is RESPONSES:
                # Stateful: a call naming a previous response gets the input that stands for.
                req = dialect.parse(session.stored_responses.expand(payload), path, query)
                remember = partial(session.stored_responses.remember, payload)
            else:
                req = dialect.parse(payload, path, query)
        except MALFORMED as exc:
            raise DialectError(400, malformed_message(exc)) from exc
        meta = {"dialect": dialect.name, "client_model": req.client_model, "path": path}
        header_session = headers.get(SESSION_HEADER)
        if header_session:
            meta["header_session_id"] = header_session
        access.stream = req.stream
        task = asyncio.create_task(self.capture.call(session, req, meta))
        # A stream is held until the engine answers or its first keepalive is due, so a call
        # that has already failed gets its real status (agents' SDKs retry on the status).
        reply = await unless_disconnected(
            task, until_disconnect, timeout=self.keepalive_s if req.stream else None
        )
        if req.stream:
            media = (
                "application/json" if req.context.get("stream_format") == JSON_ARRAY else "text/event-stream"
            )
            return CallReply(
                stream=self._stream(session, dialect, req, task, access, remember), media_type=media
            )
        assert reply is not None
        access.finish = finish_reason(reply)
        rendered = dialect.render(reply, req)
        if remember is not None:
            remember(rendered)
        return CallReply(body=rendered)

    async def _aux(self, session: LiveSession, kind: Any, payload: dict[str, Any]) -> CallReply:
        """Token counts: answered from the session's engine (or estimated); never a turn."""
        assert session.engine is not None
        if self._aux_http is None:
            self._aux_http = httpx.AsyncClient()
        try:
            body, _method = await count_tokens(
                kind,
                payload,
                engine_url=session.engine.url,
                served_model=session.served_model,
                api_key=session.engine.api_key,
                client=self._aux_http,
            )
        except MALFORMED as exc:
            raise DialectError(400, malformed_message(exc)) from exc
        return CallReply(body=body)

    def _stream(
        self,
        session: LiveSession,
        dialect: Dialect,
        req: DialectRequest,
        task: asyncio.Task[dict[str, Any]],
        access: AccessRecord,
        remember: Callable[[dict[str, Any]], None] | None = None,
    ) -> AsyncIterator[bytes]:
        """The caller's stream for a call in flight: a keepalive at once when the engine is still
        working (the hold before the start already waited one interval), more while it works, then
        the whole reply, or the error as the dialect's in-stream error events. The HTTP layer
        closing the stream (client gone) cancels the engine call."""

        memo = session.arguments

        async def events() -> Iterable[SSEEvent]:
            try:
                reply = await task
                access.finish = finish_reason(reply)
                with arguments_memo(memo):
                    if remember is not None:
                        remember(dialect.render(reply, req))
                    return list(dialect.render_stream(reply, req))
            except ProxyError as exc:
                failure = exc
            except Exception as exc:  # noqa: BLE001 - a tapdeck bug, in the capture or the rendering
                failure = _internal_error(exc, access)
            access.error = f"{failure.kind}/{failure.status}-in-stream"
            return render_stream_error(dialect, failure)

        at_once = not task.done()
        if req.context.get("stream_format") == JSON_ARRAY:
            return json_array_with_keepalive(events(), interval=self.keepalive_s)
        # A dialect whose clients choke on SSE comments names its own keepalive bytes.
        keepalive = getattr(dialect, "sse_keepalive", None) or KEEPALIVE
        return stream_with_keepalive(
            events(), interval=self.keepalive_s, keepalive=keepalive, keepalive_at_once=at_once
        )


def _models_dialect(path: str, headers: Mapping[str, str], query: Mapping[str, str]) -> Dialect:
    """Whose shape a models route answers in. `/v1/models` is shared (google-genai for Python
    asks there too, gemini-cli under `/v1beta`), so the SDK's own headers say: Anthropic's SDKs
    send `anthropic-version`, Google's a Google key."""
    if "anthropic-version" in headers:
        return ANTHROPIC
    if path.lower().startswith("/v1beta/") or "x-goog-api-key" in headers or "key" in query:
        return GOOGLE
    return CHAT


def _internal_error(exc: Exception, access: AccessRecord) -> ProxyError:
    """What a call that failed inside tapdeck answers; the traceback goes to the server's log.

    Not retryable: the same call would fail the same way, and each retry could be captured."""
    log.error("tapdeck failed on a %s call of session %s", access.dialect, access.session_id, exc_info=exc)
    kept = (
        f"the engine's reply is recorded as turn {access.seq}"
        if access.seq is not None
        else "no turn of it was recorded"
    )
    return ProxyError(
        500,
        f"tapdeck failed on this call ({type(exc).__name__}: {exc}); this is a "
        f"tapdeck bug, and the server's log has its traceback; {kept}.",
        kind="api_error",
        retryable=False,
    )


def _payload(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying what is wrong with it."""
    try:
        payload = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise DialectError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise DialectError(400, "request body must be a JSON object")
    if too_deep(payload):
        raise DialectError(400, f"request body nests deeper than {MAX_JSON_DEPTH} levels")
    return payload


__all__ = ["CallPipeline"]
