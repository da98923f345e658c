"""Server-sent events: encoding, and keeping a stream alive while the engine works.

The proxy always calls the engine without streaming and synthesises the client's stream from the
full reply, so a long generation would leave a streaming client with a silent socket; harnesses and
tunnels drop those. SSE comments (`: keepalive`) are ignored by every SSE parser and keep it open.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable

import orjson

from tapdeck.proxy.dialects.base import SSEEvent

KEEPALIVE_SECONDS = 10.0
"""Seconds between SSE comment lines while a streaming caller waits for the engine."""
KEEPALIVE = b": keepalive\n\n"


def encode(event: SSEEvent) -> bytes:
    """`event: NAME\\n` (if named) and `data: ...\\n\\n`; mapping data is compact JSON. A `bare`
    event is its JSON alone on a line, with no `data:` field (see SSEEvent.bare)."""
    data = (
        event.data
        if isinstance(event.data, str)
        else orjson.dumps(event.data, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    )
    if event.bare:
        return f"{data}\n\n".encode()
    head = f"event: {event.event}\n" if event.event else ""
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"{head}{lines}\n".encode()


async def stream_with_keepalive(
    call: Awaitable[Iterable[SSEEvent]],
    *,
    interval: float = KEEPALIVE_SECONDS,
    keepalive: bytes = KEEPALIVE,
    encode: Callable[[SSEEvent], bytes] = encode,
    keepalive_at_once: bool = False,
) -> AsyncGenerator[bytes, None]:
    """Encoded SSE bytes for a stream whose events come from one awaited call.

    While `call` runs: `keepalive` (a `: keepalive` comment unless the dialect needs other bytes)
    every `interval` seconds. When the client goes away (the HTTP layer closes or cancels this
    generator) the call is cancelled, so the engine stops generating for nobody. An exception from
    `call` propagates: the caller turns it into its dialect's error events. `encode` writes one
    event (SSE by default). `keepalive_at_once`: the first keepalive goes out at once if `call` is
    still running (the caller already held the response start for one interval).
    """
    task = asyncio.ensure_future(call)
    try:
        last = time.monotonic()
        if keepalive_at_once and not task.done():
            yield keepalive
        while True:
            done, _ = await asyncio.wait({task}, timeout=max(0.0, last + interval - time.monotonic()))
            if done:
                break
            if time.monotonic() - last >= interval:
                yield keepalive
                last = time.monotonic()
        for event in task.result():
            yield encode(event)
    finally:
        if not task.done():
            task.cancel()


async def json_array_with_keepalive(
    call: Awaitable[Iterable[SSEEvent]],
    *,
    interval: float = KEEPALIVE_SECONDS,
) -> AsyncIterator[bytes]:
    """The events' data objects as one streamed JSON array (Google's non-SSE stream form).

    `[` is sent at once, so the keepalive can be a newline: whitespace between array elements is
    valid JSON, where an SSE comment would corrupt the array. Closing this generator cancels `call`.
    """
    count = 0

    def element(event: SSEEvent) -> bytes:
        nonlocal count
        count += 1
        data = (
            event.data.encode()
            if isinstance(event.data, str)
            else orjson.dumps(event.data, option=orjson.OPT_SERIALIZE_NUMPY)
        )
        return (b"\r\n," if count > 1 else b"") + data

    yield b"["
    async with contextlib.aclosing(
        stream_with_keepalive(call, interval=interval, keepalive=b"\n", encode=element)
    ) as chunks:
        async for chunk in chunks:
            yield chunk
    yield b"]"
