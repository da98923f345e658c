"""What a request may be: how many bytes its body holds and how deeply its JSON nests.

A body is read as a stream with a running count, after the caller's key was checked, and refused
as soon as it passes the limit (a declared `Content-Length` over it is refused before any byte is
read), so no request makes the server buffer more than the limit. Nesting is bounded because a
body nested hundreds of levels deep parses but cannot be re-encoded (orjson stops at 254 levels)
and no real request comes close.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tapdeck.proxy.errors import ProxyError

MAX_JSON_DEPTH = 64
"""Deepest JSON nesting accepted in a request (a tool's JSON schema nests a dozen levels at most)."""


MALFORMED = (TypeError, ValueError, AttributeError, KeyError, IndexError)
"""What translating a request whose fields have the wrong JSON types raises (a string where a list
of blocks belongs, a number for a tool list, ...): answered as a 400, never a 500."""


def malformed_message(exc: Exception) -> str:
    """A 400's message for a request a dialect could not translate (never empty)."""
    return (
        "request has a field of the wrong type or shape (check it against the API's schema): "
        f"{type(exc).__name__}: {exc}"
    )


class BodyTooLarge(HTTPException, ProxyError):
    """A body over the server's limit (413). An HTTPException so FastAPI's own body reading, on the
    admin routes, passes it through as a 413 rather than a 400 parse error."""

    def __init__(self, limit: int, declared: int | None = None) -> None:
        size = f"declares {declared} bytes" if declared is not None else "is larger"
        message = (
            f"request body {size}; this server accepts at most {limit} bytes (tapdeck serve --max-body-bytes)"
        )
        ProxyError.__init__(self, 413, message, kind="request_too_large")
        HTTPException.__init__(self, 413, message)
        self.limit = limit


class BodyIncomplete(ProxyError):
    """The client went away before sending the whole body."""

    def __init__(self) -> None:
        super().__init__(400, "request body ended early", kind="invalid_request_error")


def declared_length(scope: Scope) -> int | None:
    """The request's `Content-Length`, or None when absent or not a number."""
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refused (BodyTooLarge) as soon as it is known to exceed `limit` bytes.

    Read from the ASGI messages themselves rather than `request.stream()`: that async generator
    cost every model call its creation and the event loop's generator bookkeeping, and one
    refused mid-body was left for the loop to finalise later."""
    declared = declared_length(request.scope)
    if declared is not None and declared > limit:
        raise BodyTooLarge(limit, declared)
    chunks: list[bytes] = []
    received = 0
    more = True
    while more:
        message = await request.receive()
        if message["type"] != "http.request":  # http.disconnect: the client left mid-body
            raise BodyIncomplete
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        received += len(chunk)
        if received > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether parsed JSON nests more than `limit` arrays/objects deep.

    Recursive, but never deeper than `limit` + 1 frames: it stops descending there. Runs on every
    model call's whole conversation, so it is kept to one call per container (a stack of
    `(item, depth)` tuples cost three times as much)."""
    return isinstance(value, (dict, list)) and _over(value, limit)


def _over(item: dict[str, Any] | list[Any], left: int) -> bool:
    """Whether container `item`, allowed `left` more levels including its own, goes past them."""
    if left <= 0:
        return True
    # Exact type checks: parsed JSON holds only dicts and lists, and `isinstance` with a tuple
    # cost twice as much per value (this visits every value of every call's conversation).
    children: Iterable[Any] = item.values() if type(item) is dict else item
    for child in children:
        kind = type(child)
        if (kind is dict or kind is list) and _over(child, left - 1):
            return True
    return False


class GuardedBodies:
    """ASGI middleware: no request body is read before its key is checked, nor past `limit`.

    Admin routes read their body through FastAPI, which reads it before any dependency runs; so
    here, before the route, an `/admin` request without the admin key gets its 401 and one that
    declares an oversized body its 413. Every body is also counted as it arrives and cut off past
    the limit (a 413 from FastAPI's own reading). The model-call route reads its body itself after
    checking the session key (`read_body`), so its refusals are in the caller's dialect.
    """

    def __init__(self, app: ASGIApp, *, limit: int, admin_ok: Callable[[Scope], bool]) -> None:
        self.app = app
        self.limit = limit
        self.admin_ok = admin_ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"].startswith("/admin"):
            if not self.admin_ok(scope):
                await _send_json(send, ProxyError(401, ADMIN_KEY_REQUIRED), {b"www-authenticate": b"Bearer"})
                return
            declared = declared_length(scope)
            if declared is not None and declared > self.limit:
                await _send_json(send, BodyTooLarge(self.limit, declared))
                return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, counted, send)


ADMIN_KEY_REQUIRED = (
    "admin key required: send `Authorization: Bearer <admin key>` "
    "(printed by `tapdeck serve`, stored in <data_dir>/admin.key)"
)


async def _send_json(send: Send, error: ProxyError, headers: dict[bytes, bytes] | None = None) -> None:
    """`error` in the admin shape, sent without reading the request (the connection closes)."""
    body = orjson.dumps(error.admin_body())
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *(headers or {}).items(),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
