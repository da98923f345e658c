"""A tapdeck server in this process: what `tapdeck serve` runs and what the TUI embeds (one code path).

Start order matters: the port is bound first (a held port fails before anything else starts), then
the embedded engine (when no engine URL is given) or the first try of the engine URL, the capture
store, the service and the runner's routes, and finally uvicorn on the already-bound socket. If any
step fails, everything started so far is stopped and the port freed.

An engine URL that does not answer yet (vLLM still loading) does not stop the start: the server
comes up awaiting it (proxy/upstream/default_engine.py), and `wait_for_engine` is how a command
waits for it, saying so every `SAY_EVERY_S`.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import ssl
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx

from tapdeck.proxy.config import (
    ServerConfig,
    admin_key_weakness,
    check_bind,
    new_admin_key,
    read_admin_key,
    secure_data_dir,
    write_admin_key,
)
from tapdeck.proxy.http.server import create_app
from tapdeck.proxy.http.uvicorn_thread import ThreadedServer, bind_socket
from tapdeck.proxy.service import CaptureService
from tapdeck.proxy.store.database import Store
from tapdeck.proxy.store.no_follow import open_no_follow
from tapdeck.proxy.upstream.default_engine import DefaultEngine
from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.proxy.upstream.toolcalls import EMBEDDED_TOOL_PARSER
from tapdeck.runner.api import EXCEPTION_HANDLERS, SHUTDOWN_GRACE_S, create_runner_router
from tapdeck.schema.tls import pinned_to

if TYPE_CHECKING:
    from tapdeck.runner.engine.registry import SharedEngine


SAY_EVERY_S = 10.0
"""How often a command waiting for its engine says so."""
KEY_LOCK_FILE = "admin.key.lock"
"""Held (flock) by the server whose generated key `admin.key` holds, for as long as it runs."""

log = logging.getLogger("tapdeck.host")


class LocalServer:
    """Start/stop a full tapdeck server (HTTP, capture service, store, maybe the embedded engine)."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        on_embedded_engine: Callable[[], None] | None = None,
        engine: bool = True,
    ) -> None:
        self.config = config
        self.on_embedded_engine = on_embedded_engine
        """Called just before the embedded engine is started or reused (after the port is bound,
        so a held port is reported alone)."""
        self.with_engine = engine
        """False: no default engine, none started or settled (a server for runs whose harness
        calls no model, such as `tapdeck rollout --harness oracle`)."""
        self.admin_key: str = config.admin_key or ""
        self.admin_key_generated = False
        self.admin_key_written = False
        """Whether `admin.key` holds this server's generated key (not while another server that
        runs on the same data dir holds the file)."""
        self.admin_key_kept = False
        """Whether the generated key is the one a previous server on this data dir left in `admin.key`."""
        self.service: CaptureService | None = None
        self.default_engine = DefaultEngine()
        """The default engine, or why not yet: the one the service, its sessions and the runner's
        routes hold."""
        self.instance: str | None = None
        self._engine: SharedEngine | None = None
        self._store: Store | None = None
        self._http: ThreadedServer | None = None
        self._sock: socket.socket | None = None
        self._key_lock: int | None = None

    @property
    def url(self) -> str:
        """`http://host:port` (`https://` with TLS) of the running server."""
        if self._http is None:
            raise RuntimeError("server not started")
        return self._http.url

    @property
    def engine_url(self) -> str | None:
        """The default engine's base URL (the embedded one when it was started here); None while
        it is awaited."""
        spec = self.default_engine.spec
        return spec.url if spec else None

    @property
    def embedded_engine(self) -> SharedEngine | None:
        """The machine's embedded engine as this server uses it (started here or reused from
        another process), when it is the default engine."""
        return self._engine

    def start(self) -> LocalServer:
        """Bind, start the parts in order, and check that /health answers with our instance id."""
        cfg = self.config
        check_bind(cfg)
        self._sock = bind_socket(cfg.host, cfg.port)
        try:
            secure_data_dir(cfg)
            if not cfg.admin_key:
                self.admin_key_generated = True
                if self._claim_key_file():
                    # A restart keeps the key its predecessor wrote, so clients attached to that
                    # server (TUIs, `rollout --server`) reconnect to this one without a new key.
                    kept = self._kept_key()
                    self.admin_key_kept = kept is not None
                    self.admin_key = kept or new_admin_key()
                    write_admin_key(cfg.admin_key_path, self.admin_key)
                    self.admin_key_written = True
                else:
                    self.admin_key = new_admin_key()
                    # Overwriting it would lock the running server's clients out (they read the
                    # key from the file); this server's key stays with its own process.
                    log.warning(
                        "another tapdeck server is running on %s and its admin key is in %s; "
                        "this server's key is not written there (both share the capture "
                        "store)",
                        cfg.data_dir,
                        cfg.admin_key_path,
                    )
            if self.with_engine:
                self.default_engine = self._start_engine()
            self._store = Store(cfg.capture_db)
            port = self._sock.getsockname()[1]
            public_host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::", "") else cfg.host
            public_host = f"[{public_host}]" if ":" in public_host else public_host
            scheme = "https" if cfg.tls else "http"
            self.service = CaptureService(
                self._store,
                default_engine=self.default_engine,
                public_url=cfg.public_url or f"{scheme}://{public_host}:{port}",
                max_reply_bytes=cfg.max_reply_bytes,
                engine_update_wait_s=cfg.engine_update_wait_s,
            )
            app = create_app(
                self.service,
                admin_key=self.admin_key,
                routers=self._runner_routers(),
                exception_handlers=EXCEPTION_HANDLERS,
                max_body_bytes=cfg.max_body_bytes,
            )
            self.instance = app.state.instance
            # uvloop: the runner's trials run on a loop of their own (runner/runner_loop.py).
            self._http = ThreadedServer(
                app,
                cfg.host,
                port,
                name="tapdeck-server",
                loop="uvloop",
                on_shutdown=self.service.events.close,
                limits=cfg.connection,
                tls=cfg.tls,
            )
            self._http.start(sock=self._sock)
            self._check_health()
            self.default_engine.keep_trying()  # when it did not answer the first try
        except BaseException:
            self.stop()
            raise
        return self

    def _start_engine(self) -> DefaultEngine:
        cfg = self.config
        if cfg.engine_url:
            # HOST:PORT, http://HOST:PORT and …/v1 all work: the address is settled to the base URL
            # that answers. One that answers as no engine does stops the start (EngineAddressError);
            # one that does not answer yet is awaited, up to `engine_wait_s`.
            engine = DefaultEngine.awaiting(
                EngineSpec(
                    url=cfg.engine_url,
                    model=cfg.engine_model,
                    api_key=cfg.engine_api_key,
                    tool_call_parser=cfg.engine_tool_parser,
                    reasoning_parser=cfg.engine_reasoning_parser,
                ),
                limit_s=cfg.engine_wait_s,
            )
            engine.try_now()
            return engine
        from tapdeck.runner.engine.registry import acquire_embedded_engine

        if self.on_embedded_engine is not None:
            self.on_embedded_engine()
        # One embedded engine per machine: a second tapdeck process reuses the running one.
        self._engine = acquire_embedded_engine()
        return DefaultEngine(
            EngineSpec(
                url=self._engine.base_url,
                model=self._engine.served_name,
                tool_call_parser=EMBEDDED_TOOL_PARSER,
            )
        )

    def _runner_routers(self) -> list:
        assert self.service is not None
        tls = self.config.tls
        return [
            create_runner_router(
                self.service,
                data_dir=self.config.data_dir,
                default_engine=self.default_engine,
                admin_key=self.admin_key,
                default_is_embedded=self._engine is not None,
                ca_file=tls.cert if tls else None,
            )
        ]

    def wait_for_engine(
        self,
        say: Callable[[str], None],
        *,
        every_s: float = SAY_EVERY_S,
        stop: threading.Event | None = None,
    ) -> bool:
        """Block until the default engine answers, calling `say` with "waiting for the engine at
        URL (N s)" every `every_s` meanwhile. False when `stop` was set first; raises the
        EngineAddressError that ended the wait (its limit passed, or the engine answered as no
        engine does, or without the model asked for)."""
        engine = self.default_engine
        said = 0
        while not engine.wait(min(0.5, every_s)):
            if stop is not None and stop.is_set():
                return False
            wait = engine.waiting()
            if wait is not None and (due := int(wait.waited_s // every_s)) > said:
                said = due
                say(wait.line())
        if engine.failure is not None:
            raise engine.failure
        return True

    def _check_health(self) -> None:
        """A stale server on a reused port would answer with another instance id."""
        assert self._http is not None  # start() calls this once the server runs
        health_host = "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host
        health_host = "::1" if health_host == "::" else health_host
        health_host = f"[{health_host}]" if ":" in health_host else health_host
        tls = self.config.tls
        resp = httpx.get(
            f"{'https' if tls else 'http'}://{health_host}:{self._http.port}/health",
            timeout=10.0,
            verify=self.client_trust,
        )
        resp.raise_for_status()
        if resp.json().get("instance") != self.instance:
            raise RuntimeError(f"another server answered on port {self._http.port}")

    @property
    def client_trust(self) -> ssl.SSLContext | bool:
        """How a client in this process verifies this server: its own certificate, whatever host
        name it names (this process reaches it over loopback)."""
        return pinned_to(self.config.tls.cert) if self.config.tls else True

    def _kept_key(self) -> str | None:
        """The key a previous server left in `admin.key`, when it is one a client can send and
        strong (as generated keys are); else None, and a fresh key replaces it."""
        try:
            key = read_admin_key(self.config.data_dir)
        except ValueError as exc:
            log.warning("%s; a new admin key replaces it", exc)
            return None
        return key if key is not None and admin_key_weakness(key) is None else None

    def _claim_key_file(self) -> bool:
        """Take the data dir's key lock for this server's life; False when a running server has it."""
        fd = open_no_follow(self.config.data_dir / KEY_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._key_lock = fd
        return True

    def stop(self) -> None:
        """Stop everything that was started (safe to call twice, or after a failed start)."""
        ended = True
        if self._http is not None:
            # The server's shutdown waits for running rollouts (SHUTDOWN_GRACE_S): wait as long,
            # so the store is never closed under a rollout still committing turns.
            ended = self._http.stop(timeout=SHUTDOWN_GRACE_S + 15)
            self._http = None
        elif self._sock is not None:
            self._sock.close()
        self._sock = None
        self.default_engine.close()
        if self._engine is not None:
            self._engine.stop()
            self._engine = None
        if self._store is not None and not ended:
            log.warning(
                "the server did not stop in time; its store stays open until the process exits "
                "(every committed turn is already on disk)"
            )
        elif self._store is not None:
            self._store.close()
            self._store = None
        if self._key_lock is not None:
            os.close(self._key_lock)  # the next server on this data dir may claim the file
            self._key_lock = None

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
