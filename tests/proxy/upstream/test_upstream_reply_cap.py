"""The cap on an engine reply's size, on real loopback sockets: a reply that never ends is cut off
at the limit (its connection dropped, nothing more buffered) and the call fails with a 502 naming
the limit, through the lean client and through httpx (an engine behind an HTTP proxy) alike."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tapdeck.proxy.upstream.client import EngineClient, EngineError
from tapdeck.proxy.upstream.tiers import EngineSpec

LIMIT = 64 * 1024
WAIT_S = 30


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    await reader.readexactly(length)


class EndlessEngine:
    """Answers every call with a chunked reply that never ends; counts what it got to send."""

    def __init__(self) -> None:
        self.sent = 0
        self.ended = asyncio.Event()
        """Set when the client dropped the connection (a write failed)."""

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        chunk = b'{"pad":"' + b"x" * 8000 + b'"},'
        try:
            while True:
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
                self.sent += len(chunk)
                await asyncio.sleep(0)
        except (ConnectionError, OSError):
            self.ended.set()
        finally:
            writer.close()


async def _serve(handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


@pytest.mark.parametrize("via", ["lean", "httpx"])
async def test_a_reply_that_never_ends_is_a_502_naming_the_limit(basic_chat, via):
    engine = EndlessEngine()
    server, url = await _serve(engine)
    http = httpx.AsyncClient() if via == "httpx" else None
    client = EngineClient(EngineSpec(url=url), http=http, max_reply_bytes=LIMIT)
    try:
        with pytest.raises(EngineError) as err:
            await asyncio.wait_for(client.complete(basic_chat), WAIT_S)
        await asyncio.wait_for(engine.ended.wait(), WAIT_S)  # the connection was dropped, not drained
    finally:
        await client.aclose()
        if http is not None:
            await http.aclose()
        server.close()
    assert err.value.status == 502 and err.value.kind == "bad_reply"
    assert f"larger than {LIMIT} bytes" in err.value.message
    assert "--max-reply-bytes" in err.value.message
    assert client.in_flight == 0


@pytest.mark.parametrize("via", ["lean", "httpx"])
async def test_a_reply_under_the_limit_is_read_whole(vllm, basic_chat, via):
    payload = json.dumps(vllm("chat_basic")["response"]).encode()

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        await writer.drain()
        writer.close()

    server, url = await _serve(engine)
    http = httpx.AsyncClient() if via == "httpx" else None
    client = EngineClient(EngineSpec(url=url), http=http, max_reply_bytes=len(payload))
    try:
        reply = await asyncio.wait_for(client.complete(basic_chat), WAIT_S)
    finally:
        await client.aclose()
        if http is not None:
            await http.aclose()
        server.close()
    assert reply["id"] == vllm("chat_basic")["response"]["id"]
