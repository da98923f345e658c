"""uvicorn's httptools protocol with what it lacks: bounded request heads and read timeouts.

uvicorn times out only a connection idle after a response (keep-alive). Without this, a head of
any size was buffered (64 MiB took 6 s and 130 MB of memory) before any key was checked, a
connection that never finished its head or body stayed open for good, and so did one that never
sent a byte. Here, per connection:

- a head (request line and headers) over `max_header_bytes` or `max_headers` lines gets a 431;
- a head not complete `header_timeout_s` after its first byte gets a 408, and a new connection
  that sends nothing for as long is closed (no reply is owed);
- a body that sends nothing for `body_timeout_s` while the server is reading it gets a 408 (or a
  close, when the app already answered).

Each refusal ends the connection (what the client still sends is read and dropped for a moment
first, so the refusal reaches it). The byte count is kept per read, not per parser callback:
httptools hands a header to Python only once it is whole, so that would come after buffering it.
One timer per connection does all the timing: a request whose head and body arrive in one read
arms none, and a body's timer is left to run out rather than cancelled when the body ends (it then
finds nothing to do), so calls on a kept-alive connection arm one at most every `body_timeout_s`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tapdeck.proxy.config import ConnectionLimits
from tapdeck.proxy.errors import ProxyError

HEAD_LINE_OVERHEAD = 4
"""Bytes a header line holds beyond its name and value (`: ` and CRLF)."""
LINGER_S = 2.0
"""How long a refused connection is still read (and what comes dropped) before it closes. Closed
at once with the client's bytes unread, the kernel answers with a reset, and a client that is still
sending then loses the 431 it was sent before reading it."""


class BoundedProtocol(HttpToolsProtocol):
    """One client connection under `limits` (a class attribute: uvicorn builds the protocol
    itself, so `for_limits` makes a subclass that carries them)."""

    limits: ConnectionLimits = ConnectionLimits()

    @classmethod
    def for_limits(cls, limits: ConnectionLimits) -> type[BoundedProtocol]:
        """The protocol class uvicorn is given (`Config(http=...)`) for `limits`."""
        return type(cls.__name__, (cls,), {"limits": limits})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reading_head = True
        """Between requests or inside a head; False from the end of a head to the end of its body."""
        self._head_bytes = 0
        """Bytes of reads that held only the current head (a read ending a head is not counted:
        the head's exact size is checked when it ends)."""
        self._heads = 0
        self._read_len = 0
        self._refused = False
        self._timer: asyncio.TimerHandle | None = None
        self._timing_body = False
        """Whether `_timer` is a body's (left running past the body's end)."""
        self._body_read_at = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout_s, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        was_reading_head, heads = self._reading_head, self._heads
        self._read_len = len(data)
        super().data_received(data)
        if self._refused or self.transport.is_closing():
            return
        if self._reading_head:
            if was_reading_head and heads == self._heads:  # this read held nothing but head
                self._head_bytes += len(data)
                if self._head_bytes > self.limits.max_header_bytes:
                    self._refuse_head(f"more than {self.limits.max_header_bytes} bytes")
                elif self._head_bytes == len(data):  # its first bytes: the head's clock starts
                    self._arm(self.limits.header_timeout_s, self._head_late)
        else:
            self._body_read_at = self.loop.time()
            if self._timer is None:
                self._arm(self.limits.body_timeout_s, self._body_late, body=True)

    # httptools callbacks
    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._heads += 1
        self._reading_head = False
        if self._timer is not None and not self._timing_body:
            self._stop_timer()
        limits = self.limits
        if len(self.headers) > limits.max_headers:
            self._refuse_head(f"{len(self.headers)} header lines (at most {limits.max_headers})")
            return
        # Only a head that could be over the limit is measured (the reads it came in could hold it).
        if self._head_bytes + self._read_len > limits.max_header_bytes:
            size = len(self.url) + sum(len(n) + len(v) + HEAD_LINE_OVERHEAD for n, v in self.headers)
            if size > limits.max_header_bytes:
                self._refuse_head(f"{size} bytes (at most {limits.max_header_bytes})")
                return
        self._head_bytes = 0
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._reading_head = True
        super().on_message_complete()
        if self.cycle is not None and self.cycle.response_complete:
            # Answered before its body was in (a refusal): uvicorn armed its keep-alive clock at
            # the reply and every read since stopped it, so the idle wait is bounded here.
            self._arm(self.limits.keep_alive_s, self._head_late)

    # timers
    def _arm(self, seconds: float, late: Callable[[], None], *, body: bool = False) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(seconds, late)
        self._timing_body = body

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _answering(self) -> bool:
        """Whether a response on this connection is under way (its request's bytes are all in)."""
        return self.cycle is not None and not self.cycle.response_complete

    def _head_late(self) -> None:
        self._timer = None
        if self.transport.is_closing() or not self._reading_head:
            return
        if self._answering():
            # A pipelined head arrived while an earlier request is being answered: that one's
            # reply comes first, so this head's clock starts again.
            self._arm(self.limits.header_timeout_s, self._head_late)
            return
        if self._head_bytes == 0:
            self.transport.close()  # idle, nothing of a request sent: no reply owed
            return
        self._reply_and_close(
            ProxyError(
                408,
                f"request headers not complete within {self.limits.header_timeout_s:g} s "
                "(tapdeck serve --header-timeout)",
                kind="request_timeout",
            )
        )

    def _body_late(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._reading_head:
            return  # the body ended (its timer was left running)
        now, limit = self.loop.time(), self.limits.body_timeout_s
        waited = now - self._body_read_at
        if self.flow.read_paused:  # the app is not reading: the client is not the one stalling
            self._body_read_at, waited = now, 0.0
        if waited < limit:
            self._arm(limit - waited, self._body_late, body=True)
            return
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()
            return
        self._reply_and_close(
            ProxyError(
                408,
                f"request body stalled: nothing for {limit:g} s (tapdeck serve --body-timeout)",
                kind="request_timeout",
            )
        )

    # refusals
    def _refuse_head(self, what: str) -> None:
        self._reply_and_close(
            ProxyError(
                431,
                f"request head has {what}; send fewer or smaller headers (tapdeck serve "
                "--max-header-bytes / --max-headers)",
                kind="request_header_too_large",
                retryable=False,
            )
        )

    def _reply_and_close(self, error: ProxyError) -> None:
        """`error` in the admin API's shape (the path may not be known yet), then the end of the
        connection: no app sees this request, and one already running sees a disconnect."""
        self._refused = True
        body = orjson.dumps(error.admin_body())
        phrase = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}[error.status]
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (error.status, phrase, len(body), body)
        )
        if self.transport.can_write_eof():  # TLS cannot half-close; its client has the length
            self.transport.write_eof()
        self._arm(LINGER_S, self.transport.close)


__all__ = ["BoundedProtocol"]
