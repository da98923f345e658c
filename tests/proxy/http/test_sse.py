"""capture-cases B18: keepalive comments while the engine works; a client hang-up cancels the call.

Timing-free: the upstream call waits on an event the test sets, intervals are tiny."""

from __future__ import annotations

import asyncio

from tapdeck.proxy.dialects.base import SSEEvent
from tapdeck.proxy.http.sse import KEEPALIVE, encode, stream_with_keepalive


def test_encode_json_named_and_done():
    assert encode(SSEEvent(data={"a": 1})) == b'data: {"a":1}\n\n'
    assert encode(SSEEvent(data={"type": "ping"}, event="ping")) == b'event: ping\ndata: {"type":"ping"}\n\n'
    assert encode(SSEEvent(data="[DONE]")) == b"data: [DONE]\n\n"
    assert encode(SSEEvent(data="a\nb")) == b"data: a\ndata: b\n\n"


async def test_keepalives_while_waiting_then_events():
    release = asyncio.Event()

    async def call():
        await release.wait()
        return [SSEEvent(data={"n": 1}), SSEEvent(data="[DONE]")]

    out = []
    async for chunk in stream_with_keepalive(call(), interval=0.01):
        out.append(chunk)
        if out.count(KEEPALIVE) == 2:
            release.set()
    assert out[:2] == [KEEPALIVE, KEEPALIVE]
    assert out[-2:] == [b'data: {"n":1}\n\n', b"data: [DONE]\n\n"]


async def _hanging_call(started: asyncio.Event, cancelled: asyncio.Event) -> list:
    """An upstream call that never answers; records that it started and that it was cancelled."""
    started.set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        cancelled.set()
        raise
    return []


async def test_closing_the_generator_cancels_upstream_call():
    started, cancelled = asyncio.Event(), asyncio.Event()
    gen = stream_with_keepalive(_hanging_call(started, cancelled), interval=0.01)
    assert await gen.__anext__() == KEEPALIVE
    await gen.aclose()  # what the ASGI server does when the client goes away
    await asyncio.wait_for(cancelled.wait(), 5)


async def test_call_error_propagates_to_caller():
    async def call():
        raise RuntimeError("boom")

    try:
        async for _ in stream_with_keepalive(call(), interval=10):
            pass
    except RuntimeError as exc:
        assert str(exc) == "boom"
    else:
        raise AssertionError("error swallowed")
