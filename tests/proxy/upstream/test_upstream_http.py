"""The lean engine client on real loopback sockets: retries while the engine is up, clear errors
when it is down, keep-alive reuse and HTTP framing."""

from __future__ import annotations

import asyncio
import json
import socket
import struct

import pytest

from tapdeck.proxy.upstream import transport as upstream_http
from tapdeck.proxy.upstream.client import EngineClient, EngineError
from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.proxy.upstream.transport import UpstreamHTTP


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


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST, as a kernel does for a connection its full accept queue drops."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _serve(handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


async def _engine_error(engine, chat: dict) -> EngineError:
    """What the engine client raises for one call to the loopback `engine`."""
    server, url = await _serve(engine)
    client = EngineClient(EngineSpec(url=url))
    try:
        with pytest.raises(EngineError) as err:
            await client.complete(chat)
    finally:
        await client.aclose()
        server.close()
    return err.value


async def test_connection_reset_before_any_reply_is_retried_while_the_engine_is_up(vllm, basic_chat):
    payload = json.dumps(vllm("chat_basic")["response"]).encode()
    connections = 0

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _read_request(reader)
        if connections == 1:
            _reset(writer)
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        await writer.drain()
        writer.close()

    server, url = await _serve(engine)
    client = EngineClient(EngineSpec(url=url))
    try:
        reply = await asyncio.wait_for(client.complete(basic_chat), 30)
    finally:
        await client.aclose()
        server.close()
    assert reply["id"] == vllm("chat_basic")["response"]["id"]
    assert connections == 2


async def test_engine_that_always_drops_the_request_fails_with_a_message_not_an_empty_one(basic_chat):
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.close()

    err = await _engine_error(engine, basic_chat)
    assert err.kind == "unreachable"
    assert err.message.endswith(
        f"({upstream_http.CONNECT_ATTEMPTS} attempts over {sum(upstream_http.CONNECT_BACKOFF_S):.2f} s)"
    )
    assert "closed the connection before replying" in err.message


async def test_reply_cut_mid_body_is_not_retried(vllm, basic_chat):
    calls = 0

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal calls
        calls += 1
        await _read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n{"id":')
        await writer.drain()
        writer.close()

    err = await _engine_error(engine, basic_chat)
    assert calls == 1  # the engine did the work: a resend would sample again
    assert err.kind == "unreachable" and "mid-reply" in err.message


async def _two_calls(response: bytes) -> tuple[UpstreamHTTP, list]:
    """Two GETs in a row to a keep-alive engine answering each with `response`."""

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await _read_request(reader)
            except asyncio.IncompleteReadError:
                writer.close()
                return
            writer.write(response)
            await writer.drain()

    server, url = await _serve(engine)
    http = UpstreamHTTP(url, connect_timeout=5, read_timeout=5)
    try:
        replies = [await http.request("GET", "/models") for _ in range(2)]
    finally:
        http.close()
        server.close()
    return http, replies


async def test_chunked_reply_and_keep_alive_reuse():
    parts = [b'{"object":', b'"list","data":[]}']
    http, replies = await _two_calls(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
        + b"0\r\n\r\n"
    )
    assert [r.status for r in replies] == [200, 200]
    assert json.loads(replies[1].body) == {"object": "list", "data": []}
    assert http.connections_opened == 1


async def test_connection_idle_past_the_reuse_window_is_replaced(monkeypatch):
    monkeypatch.setattr(upstream_http, "IDLE_REUSE_S", 0.0)
    http, _ = await _two_calls(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
    assert http.connections_opened == 2


def test_only_http_urls_are_taken():
    with pytest.raises(ValueError, match="not an http"):
        UpstreamHTTP("unix:///tmp/x", connect_timeout=1, read_timeout=1)


def test_engine_behind_an_env_proxy_keeps_httpx_which_honours_it(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.test:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert EngineClient(EngineSpec(url="http://vllm.test:8000/v1"))._lean is None
    monkeypatch.setenv("NO_PROXY", "vllm.test")
    assert EngineClient(EngineSpec(url="http://vllm.test:8000/v1"))._lean is not None
