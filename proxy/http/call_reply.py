"""What a model call hands the HTTP layer: a JSON body or a byte stream, errors included."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tapdeck.proxy.errors import ProxyError
from tapdeck.proxy.http.access_log import AccessRecord


@dataclass
class CallReply:
    """What the HTTP layer sends back: a JSON body, or an SSE byte stream."""

    status: int = 200
    body: Any = None
    stream: AsyncIterator[bytes] | None = None
    media_type: str = "text/event-stream"
    """The stream's content type (Google's non-SSE stream is a JSON array)."""
    kind: str | None = None
    """An error reply's kind (`authentication_error`, `unreachable`, ...), for the access log."""
    headers: dict[str, str] | None = None
    """Headers of a JSON reply (an error's `x-should-retry`)."""


async def unless_disconnected(
    task: asyncio.Task[dict[str, Any]],
    until_disconnect: Callable[[], Awaitable[None]] | None,
    timeout: float | None = None,
) -> dict[str, Any] | None:
    """Await the call, cancelling it if the client hangs up first; None when `timeout` passes
    first (the call goes on)."""
    watcher = asyncio.ensure_future(until_disconnect()) if until_disconnect is not None else None
    try:
        await asyncio.wait(
            {task} if watcher is None else {task, watcher},
            timeout=timeout,
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        if watcher is not None:
            watcher.cancel()
    if task.done():
        return task.result()
    if watcher is not None and watcher.done():
        task.cancel()
        raise ProxyError(499, "client closed the request", kind="client_closed")
    return None


async def logged(stream: AsyncIterator[bytes], access: AccessRecord) -> AsyncIterator[bytes]:
    """The stream, with the call's access line written when it ends (or the client leaves)."""
    access.status = 200
    try:
        async with contextlib.aclosing(stream) as chunks:  # type: ignore[type-var]
            async for chunk in chunks:
                yield chunk
    except BaseException:
        access.error = access.error or "client_closed"
        raise
    finally:
        access.emit()


def finish_reason(reply: Mapping[str, Any]) -> str | None:
    """The reply's finish reason for the access log (`tapdeck_stop` for a synthetic stop)."""
    choice = (reply.get("choices") or [{}])[0] or {}
    if reply.get("tapdeck_synthetic"):
        return "tapdeck_stop"
    return choice.get("finish_reason")


__all__ = ["CallReply", "finish_reason", "logged", "unless_disconnected"]
