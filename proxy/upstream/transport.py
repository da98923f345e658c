"""A lean HTTP/1.1 client for the engine: keep-alive connections on asyncio protocols, httptools parsing.

Why not httpx here: one engine call through httpx/httpcore cost about a third of the proxy's CPU
per call (URL and header models, cookie handling, anyio cancel scopes, a socket poll per idle
connection on every request). The proxy sends two kinds of request to one origin and reads whole
JSON bodies, so a protocol that writes the request in one buffer and feeds the reply to httptools'
C parser does the same work for a small fraction of that.

A reply is read whole, but never past `max_reply_bytes`: beyond it the connection is dropped and
the call fails (`UpstreamReplyTooLarge`), so an engine that never ends a reply cannot make the
proxy buffer without bound.

Failures while the engine is up are retried: a kept-alive connection the engine closed as it was
reused (the request never reached it), and a fresh connection refused or reset before any reply
byte (an accept queue overflowing in a burst), with a short backoff. When every attempt fails the
error names what happened (`ConnectionRefusedError: [Errno 111] ...`), never an empty message.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from typing import NamedTuple
from urllib.parse import urlsplit

import httptools

from tapdeck.proxy.config import DEFAULT_MAX_REPLY_BYTES

CONNECT_ATTEMPTS = 4
CONNECT_BACKOFF_S = (0.02, 0.05, 0.1)
"""Waits between attempts at a fresh connection. Short: a dead engine's refusal reaches the agent
(as a retryable 502) within a streaming call's first keepalive interval."""
IDLE_REUSE_S = 4.0
"""A connection idle longer is closed instead of reused: uvicorn (vLLM's server) drops idle
keep-alive connections after 5 s, and reusing one just as it closes races the engine's close."""
MAX_IDLE = 256
"""Idle connections kept per origin; more are closed when returned."""


class UpstreamReply(NamedTuple):
    """A whole HTTP reply."""

    status: int
    reason: str
    body: bytes


class UpstreamUnreachable(OSError):
    """No reply: the connection could not be made, or was lost before a full reply. `str()` says why."""


class UpstreamTimeout(TimeoutError):
    """Connect or read timed out."""


class UpstreamReplyTooLarge(Exception):
    """The reply's body passed `limit` bytes; the rest was not read (its connection is closed)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"reply body over {limit} bytes")
        self.limit = limit


class _Lost(Exception):
    """The connection closed before the reply was complete; `started` if any reply byte came."""

    def __init__(self, why: str, started: bool) -> None:
        super().__init__(why)
        self.started = started


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self, max_reply_bytes: int) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._max_body = max_reply_bytes
        self._body_bytes = 0
        self._body: list[bytes] = []
        self._reason = b""
        self._started = False
        self._done: asyncio.Future[UpstreamReply] | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._started = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(_Lost(f"malformed HTTP reply ({exc})", started=True))
            self.close()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        why = f"{type(exc).__name__}: {exc}" if exc is not None else "the engine closed the connection"
        self._fail(_Lost(why + (" mid-reply" if self._started else " before replying"), self._started))

    # httptools callbacks
    def on_status(self, status: bytes) -> None:
        self._reason += status

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self._max_body:
            if not self.closed:  # the rest of this read is dropped with the connection
                self._fail(UpstreamReplyTooLarge(self._max_body))
                self.close()
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        done = self._done
        if done is not None and not done.done():
            done.set_result(
                UpstreamReply(
                    self._parser.get_status_code(), self._reason.decode("latin-1"), b"".join(self._body)
                )
            )
        if not self._parser.should_keep_alive():
            self.close()

    # client side
    def _fail(self, exc: Exception) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)

    def send(self, head: bytes, body: bytes | None) -> asyncio.Future[UpstreamReply]:
        """Write one request, its head and body as they are; the future holds its reply."""
        assert self.transport is not None
        self._body, self._body_bytes, self._reason, self._started = [], 0, b"", False
        self._done = asyncio.get_running_loop().create_future()
        # Two buffers in one vectored write: joining them first copied every call's whole body
        # (~450 kB at a 107k-token prompt) into a new buffer only to send it.
        self.transport.writelines((head, body) if body else (head,))
        return self._done

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class UpstreamHTTP:
    """Pooled keep-alive HTTP/1.1 to one origin (`http://host:port` or `https://…`).

    No cap on connections in flight: each call holds one, and the engine's own server decides
    how many it takes (vLLM queues them). Safe to share between tasks of one event loop.
    """

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float | None,
        read_timeout: float | None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        default_port = self.port == (443 if parts.scheme == "https" else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._host_header = (host if default_port else f"{host}:{self.port}").encode()
        self._ssl = (ssl_context or ssl.create_default_context()) if parts.scheme == "https" else None
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_reply_bytes = max_reply_bytes
        self._idle: collections.deque[_Connection] = collections.deque()
        self._closed = False
        self.connections_opened = 0
        """Fresh connections made (for tests and the bench: reuse keeps this low)."""

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        prefixed: bool = True,
    ) -> UpstreamReply:
        """Send `method prefix+path` (`path` alone when not `prefixed`: a route beside the base
        URL's path, such as vLLM's `/tokenize`) and return the whole reply. Raises
        UpstreamUnreachable, UpstreamTimeout or UpstreamReplyTooLarge."""
        target = f"{self.prefix}{path}" if prefixed else path
        lines = [
            f"{method} {target} HTTP/1.1\r\n".encode(),
            b"Host: ",
            self._host_header,
            b"\r\nAccept: application/json\r\n",
        ]
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}\r\n".encode())
        if body is not None:
            lines.append(b"Content-Length: %d\r\n" % len(body))
        lines.append(b"\r\n")
        head = b"".join(lines)
        connect_failures: list[str] = []
        while True:
            conn, reused = self._take_idle(), True
            if conn is None:
                reused = False
                try:
                    conn = await self._connect()
                except TimeoutError:
                    raise UpstreamTimeout(f"connect timed out after {self.connect_timeout} s") from None
                except OSError as exc:
                    connect_failures.append(_describe(exc))
                    if len(connect_failures) >= CONNECT_ATTEMPTS:
                        raise self._down(connect_failures) from None
                    await asyncio.sleep(CONNECT_BACKOFF_S[len(connect_failures) - 1])
                    continue
            try:
                async with asyncio.timeout(self.read_timeout):
                    reply = await conn.send(head, body)
            except _Lost as exc:
                conn.close()
                if exc.started:
                    raise UpstreamUnreachable(f"connection lost mid-reply ({exc})") from None
                if reused:
                    continue  # a stale keep-alive connection: the request never reached the engine
                connect_failures.append(str(exc))
                if len(connect_failures) >= CONNECT_ATTEMPTS:
                    raise self._down(connect_failures) from None
                await asyncio.sleep(CONNECT_BACKOFF_S[len(connect_failures) - 1])
                continue
            except TimeoutError:
                conn.close()
                raise UpstreamTimeout(f"no reply within {self.read_timeout} s (read timeout)") from None
            except BaseException:
                conn.close()  # cancelled mid-request: the connection's state is unknown
                raise
            self._give_back(conn)
            return reply

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # most recently used first: the one least likely to be stale
            if not conn.closed and now - conn.idle_since < IDLE_REUSE_S:
                return conn
            conn.close()
        return None

    def _give_back(self, conn: _Connection) -> None:
        if conn.closed or self._closed or len(self._idle) >= MAX_IDLE:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout):
            _, conn = await loop.create_connection(
                lambda: _Connection(self.max_reply_bytes),
                self.host,
                self.port,
                ssl=self._ssl,
                server_hostname=self.host if self._ssl else None,
            )
        self.connections_opened += 1
        return conn

    def _down(self, failures: list[str]) -> UpstreamUnreachable:
        last = failures[-1]
        return UpstreamUnreachable(
            f"{last} ({len(failures)} attempts over {sum(CONNECT_BACKOFF_S[: len(failures) - 1]):.2f} s)"
        )

    def close(self) -> None:
        """Close idle connections; those in flight close when their call ends."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


__all__ = ["UpstreamHTTP", "UpstreamReply", "UpstreamReplyTooLarge", "UpstreamTimeout", "UpstreamUnreachable"]
