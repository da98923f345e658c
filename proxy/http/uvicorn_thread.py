"""Run an ASGI app with uvicorn in its own thread, on a socket bound before anything else starts.

Why not plain `uvicorn.run`: on the main thread uvicorn takes over SIGINT/SIGTERM (a TUI would keep
showing a dead server), and its own bind uses protocol 0, on which asyncio never sets TCP_NODELAY
(~48 ms per request instead of ~1.5 ms). Binding first also turns a held port into an OSError that
names the port, before any other part has started.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

import uvicorn

from tapdeck.proxy.config import ConnectionLimits, TlsFiles
from tapdeck.proxy.errors import ProxyError
from tapdeck.proxy.http.bounded_protocol import BoundedProtocol
from tapdeck.proxy.http.error_reply import error_response


class PortInUseError(OSError):
    """The requested address cannot be bound: the port is held by another process, or the host
    is not one of this machine's addresses (the message says which)."""

    def __str__(self) -> str:
        return str(self.strerror)  # the message alone: no `[Errno N]` before it


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind a listening TCP socket (IPPROTO_TCP, SO_REUSEADDR); raise PortInUseError naming the
    port when it is held, the host when it is not this machine's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        hints: dict[int | None, str] = {
            errno.EADDRINUSE: f"{exc.strerror} (is another server already using port {port}?)",
            errno.EADDRNOTAVAIL: f"{host} is not an address of this machine",
        }
        why = hints.get(exc.errno, exc.strerror)
        raise PortInUseError(exc.errno, f"cannot bind {host}:{port}: {why}") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


STOPPING_MESSAGE = "the tapdeck server is stopping; retry once it is back"
"""What a request the server cut short as it stopped is told (the client may retry it)."""
DEFAULT_LIMITS = ConnectionLimits()
"""The limits a server is held to unless it is given its own (frozen: one instance serves all)."""


def stopping_error() -> ProxyError:
    """The error a request cut short by the server stopping gets (a 503: retryable)."""
    return ProxyError(503, STOPPING_MESSAGE, kind="server_stopping")


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves the process's signal handlers alone, and calls `on_shutdown`
    (on its loop) as it starts shutting down."""

    on_shutdown: Callable[[], None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Before uvicorn waits for open requests: endless ones (event streams) must be told to end,
        # or it cancels them after its grace period and logs a traceback for each.
        if self.on_shutdown is not None:
            self.on_shutdown()
        await super().shutdown(sockets)


class ThreadedServer:
    """An ASGI app served by uvicorn on a daemon thread, on an asyncio loop or on uvloop (what the
    tapdeck server uses: less CPU per call; Harbor trials cannot run on it, see runner_loop).

    `start()` binds first (so a clash raises before anything runs), then waits until uvicorn accepts.
    Every connection is held to `limits`; with `tls` it serves HTTPS (uvicorn's own TLS).
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        name: str = "tapdeck-http",
        loop: Literal["asyncio", "uvloop"] = "asyncio",
        on_shutdown: Callable[[], None] | None = None,
        limits: ConnectionLimits = DEFAULT_LIMITS,
        tls: TlsFiles | None = None,
    ) -> None:
        self.app = app
        self.limits = limits
        self.tls = tls
        self.on_shutdown = on_shutdown
        self.loop = loop
        self.host = host
        self.requested_port = port
        self.name = name
        self._sock: socket.socket | None = None
        self._server: _QuietServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when started on port 0)."""
        if self._sock is None:
            raise RuntimeError("server not started")
        port: int = self._sock.getsockname()[1]
        return port

    @property
    def url(self) -> str:
        """`http://host:port` (`https://` with TLS) of the running server."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def start(self, timeout: float = 30.0, *, sock: socket.socket | None = None) -> ThreadedServer:
        """Bind (or take `sock`, bound earlier with `bind_socket`), start the serving thread and
        wait until it is accepting connections."""
        self._sock = sock if sock is not None else bind_socket(self.host, self.requested_port)
        # No proxy_headers: nothing here reads the client's address, and uvicorn's middleware
        # for X-Forwarded-For scanned every model call's headers for it. No websockets: nothing
        # serves them, and an upgrade would hand the connection to a protocol without the limits.
        config = uvicorn.Config(
            self._app_quiet_at_shutdown,
            interface="asgi3",
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=2,
            loop=self.loop,
            http=BoundedProtocol.for_limits(self.limits),
            ws="none",
            # uvicorn annotates int, but only hands it to loop.call_later
            timeout_keep_alive=self.limits.keep_alive_s,  # type: ignore[arg-type]
            proxy_headers=False,
            ssl_certfile=self.tls.cert if self.tls else None,
            ssl_keyfile=self.tls.key if self.tls else None,
        )
        self._server = _QuietServer(config)
        self._server.on_shutdown = self.on_shutdown
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name=self.name, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                self.stop()  # uvicorn leaves the socket it was given open (a lifespan failure)
                raise RuntimeError(f"{self.name} exited during start-up")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.name} did not start within {timeout:.0f} s")
            time.sleep(0.01)
        return self

    async def _app_quiet_at_shutdown(self, scope: Any, receive: Any, send: Any) -> None:
        started = False

        async def noting_send(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        except asyncio.CancelledError:
            # uvicorn cancels requests still open after its grace period (a model call waiting on
            # the engine) and says so in one line; re-raised, each would also log a traceback.
            if self._server is None or not self._server.should_exit:
                raise
            if scope["type"] == "http" and not started:
                # In the envelope the path's caller reads (its dialect's, or the admin API's).
                await error_response(scope["path"], stopping_error())(scope, receive, send)

    def stop(self, timeout: float = 10.0) -> bool:
        """Ask uvicorn to exit, wait for the thread, and free the port. False when the thread
        was still running after `timeout` (its shutdown, e.g. rollouts finishing, goes on)."""
        if self._server is not None:
            self._server.should_exit = True
        ended = True
        if self._thread is not None:
            self._thread.join(timeout)
            ended = not self._thread.is_alive()
        if self._sock is not None:
            self._sock.close()
        self._thread = None
        return ended

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
