"""`tapdeck serve`: run the capture proxy + admin API (and the embedded engine) in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tapdeck.app.commands.options import (
    DataDirOption,
    EngineApiKeyOption,
    EngineModelOption,
    EngineWaitOption,
    PublicUrlOption,
    TlsKeyOption,
    admin_key_option,
    engine_option,
    tls_cert_option,
)
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_USAGE, CommandError
from tapdeck.proxy.config import DEFAULT_ENGINE_WAIT_S

if TYPE_CHECKING:
    from tapdeck.app.host import LocalServer


def _log_to_stderr() -> None:
    """tapdeck's log (one access line per model call, refused ones included) on stderr."""
    import logging

    logger = logging.getLogger("tapdeck")
    if any(getattr(h, "tapdeck_serve", False) for h in logger.handlers):
        return  # already set up (serve called twice in one process, as tests do)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.tapdeck_serve = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


YOUNG_GC_THRESHOLD = 20_000
"""Container allocations (net of frees) between the cyclic collector's young passes; CPython's
default is 700."""


def settle_collector() -> None:
    """Keep what start-up built out of the cyclic collector, and run its young passes less often.

    What start-up built (modules, the app, the engine) lives as long as the process: frozen, the
    collector's passes no longer walk it (they were ~8 % of the serving thread's CPU per call by
    `perf` at 16 sessions, ~4 % after). A proxied call leaves ~100 containers behind and allocates
    many more that die within it; at the default threshold a young pass ran every ~6 calls and
    walked those in flight too. At 20,000 the collector's CPU per call fell from ~87 to ~18 µs
    (`bench/proxy_parts.py`, 16 sessions), a young pass taking ~5 ms every few hundred calls.
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_GC_THRESHOLD)


def unresolvable(host: str) -> str | None:
    """Why `--host` cannot be bound because the name does not resolve (None: it resolves), so the
    bind's own error is not read as a port in use."""
    import socket

    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"--host {host!r} does not resolve ({exc.strerror})"
    return None


def register(app: typer.Typer) -> None:
    """Add the `serve` command."""

    @app.command("serve")
    def serve(
        port: int = typer.Option(
            8300, "--port", min=0, max=65535, help="Port to listen on (0 = any free port)."
        ),
        host: str = typer.Option(
            "127.0.0.1",
            "--host",
            help="Address to bind. Beyond loopback an explicit, strong admin key is required.",
        ),
        engine: Annotated[
            str | None,
            engine_option(
                "Default engine: HOST:PORT, http://HOST:PORT or …/v1 (settled by asking …/models). "
                "Omitted: start the embedded engine."
            ),
        ] = None,
        engine_model: EngineModelOption = None,
        engine_api_key: EngineApiKeyOption = None,
        engine_wait: EngineWaitOption = DEFAULT_ENGINE_WAIT_S,
        engine_tool_parser: str | None = typer.Option(
            None,
            "--engine-tool-parser",
            help="The tool-call parser that engine's chat route runs "
            "(vLLM's --tool-call-parser, e.g. hermes): token-in capture parses tool calls with it. "
            "Unset or unknown: calls with tools are captured as text.",
        ),
        engine_reasoning_parser: str | None = typer.Option(
            None,
            "--engine-reasoning-parser",
            help="The reasoning parser that engine runs, if any "
            "(vLLM's --reasoning-parser): token-in capture then sends every call as text.",
        ),
        admin_key: Annotated[
            str | None,
            admin_key_option(
                "Admin API key (visible in `ps`: prefer $TAPDECK_ADMIN_KEY or --admin-key-file). "
                "Omitted: generate one and write <data-dir>/admin.key."
            ),
        ] = None,
        admin_key_file: Path | None = typer.Option(
            None,
            "--admin-key-file",
            envvar="TAPDECK_ADMIN_KEY_FILE",
            help="Read the admin API key from this file (first line).",
        ),
        max_body_bytes: int | None = typer.Option(
            None, "--max-body-bytes", min=1, help="Largest request body accepted (default 32 MiB)."
        ),
        max_header_bytes: int | None = typer.Option(
            None,
            "--max-header-bytes",
            min=1,
            help="Largest request head (request line and headers) "
            "accepted; a 431 beyond it, before any key is checked (default 64 KiB).",
        ),
        max_headers: int | None = typer.Option(
            None, "--max-headers", min=1, help="Most header lines in one request; a 431 beyond (default 100)."
        ),
        header_timeout: float | None = typer.Option(
            None,
            "--header-timeout",
            min=0.001,
            help="Seconds a request's headers may take from its "
            "first byte (a 408 after), and a new connection may stay silent (default 30).",
        ),
        body_timeout: float | None = typer.Option(
            None,
            "--body-timeout",
            min=0.001,
            help="Seconds a request body may pause between reads; a 408 after (default 30).",
        ),
        keep_alive_timeout: float | None = typer.Option(
            None,
            "--keep-alive-timeout",
            min=0.001,
            help="Seconds an idle client connection is kept open between requests (default 75).",
        ),
        max_reply_bytes: int | None = typer.Option(
            None,
            "--max-reply-bytes",
            min=1,
            help="Largest engine reply read for one call; a 502 "
            "naming this limit beyond it (default 32 MiB).",
        ),
        engine_update_wait: float | None = typer.Option(
            None,
            "--engine-update-wait",
            min=0,
            help="Seconds a model call the engine refuses with a 503 (updating its weights) is "
            "resent for before the agent gets the 503; 0 passes it on at once (default 300).",
        ),
        tls_cert: Annotated[
            Path | None,
            tls_cert_option(
                "Serve HTTPS with this certificate (PEM, chain after it); needs --tls-key. Use it when "
                "--host leaves loopback."
            ),
        ] = None,
        tls_key: TlsKeyOption = None,
        data_dir: DataDirOption = None,
        public_url: PublicUrlOption = None,
    ) -> None:
        """Serve the capture proxy and admin API until interrupted (Ctrl-C or SIGTERM)."""
        import signal
        import threading

        from pydantic import ValidationError

        from tapdeck.app.failures import validation_line
        from tapdeck.app.host import LocalServer
        from tapdeck.proxy.config import (
            ConfigError,
            ConnectionLimits,
            ServerConfig,
            TlsFiles,
            cleartext_warning,
            read_key_file,
        )
        from tapdeck.proxy.http.uvicorn_thread import PortInUseError
        from tapdeck.proxy.upstream.address import EngineAddressError, shown_url

        fields = {
            "host": host,
            "port": port,
            "admin_key": admin_key,
            "engine_url": engine,
            "engine_model": engine_model,
            "engine_api_key": engine_api_key,
            "engine_wait_s": engine_wait,
            "engine_tool_parser": engine_tool_parser,
            "engine_reasoning_parser": engine_reasoning_parser,
            "public_url": public_url,
        }
        if data_dir is not None:
            fields["data_dir"] = data_dir
        if max_body_bytes is not None:
            fields["max_body_bytes"] = max_body_bytes
        if max_reply_bytes is not None:
            fields["max_reply_bytes"] = max_reply_bytes
        if engine_update_wait is not None:
            fields["engine_update_wait_s"] = engine_update_wait
        limits = {
            "max_header_bytes": max_header_bytes,
            "max_headers": max_headers,
            "header_timeout_s": header_timeout,
            "body_timeout_s": body_timeout,
            "keep_alive_s": keep_alive_timeout,
        }
        fields["connection"] = ConnectionLimits.model_validate(
            {k: v for k, v in limits.items() if v is not None}
        )
        if (tls_cert is None) != (tls_key is None):
            raise CommandError(EXIT_USAGE, "tapdeck serve: give --tls-cert and --tls-key together")
        if tls_cert is not None and tls_key is not None:
            fields["tls"] = TlsFiles(cert=tls_cert.expanduser(), key=tls_key.expanduser())
        try:
            if admin_key_file is not None:
                if admin_key:
                    raise ValueError(
                        "give the admin key once: --admin-key/$TAPDECK_ADMIN_KEY or --admin-key-file"
                    )
                fields["admin_key"] = read_key_file(admin_key_file)
            config = ServerConfig.model_validate(fields)
        except ValidationError as exc:
            raise CommandError(EXIT_USAGE, f"tapdeck serve: {validation_line(exc)}") from None
        except ValueError as exc:
            raise CommandError(EXIT_USAGE, f"tapdeck serve: {exc}") from None
        if (problem := unresolvable(host)) is not None:
            raise CommandError(EXIT_USAGE, f"tapdeck serve: {problem}")
        _log_to_stderr()
        server = LocalServer(
            config,
            on_embedded_engine=lambda: typer.echo(
                "starting the embedded engine, or reusing the one another tapdeck process serves "
                "(SmolLM2-135M; it never solves tasks, reward 0 — pass --engine URL for a real model)…",
                err=True,
            ),
        )
        try:
            server.start()
        except (ConfigError, PortInUseError) as exc:
            raise CommandError(EXIT_USAGE, f"tapdeck serve: {exc}") from None
        except EngineAddressError as exc:
            raise CommandError(
                EXIT_USAGE if exc.status == 400 else EXIT_COULD_NOT_RUN, f"tapdeck serve: {exc}"
            ) from None
        settle_collector()
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        awaited = server.engine_url is None  # an engine URL that did not answer yet
        engine_line = f"waiting for {shown_url(engine or '')}" if awaited else server.engine_url
        typer.echo(f"tapdeck server at {server.url}  (engine: {engine_line}; data: {config.data_dir})")
        if (warning := cleartext_warning(config)) is not None:
            typer.echo(f"tapdeck serve: {warning}", err=True)
        if (shared := server.embedded_engine) is not None and not shared.owned:
            typer.echo(shared.reuse_line())
        if server.admin_key_generated:
            typer.echo(f"admin key: {server.admin_key}  ({_where_the_key_is(server, config.admin_key_path)})")
        try:
            if not server.wait_for_engine(lambda line: typer.echo(line, err=True), stop=stop):
                return  # interrupted while it waited
            if awaited:
                waited = server.default_engine.waited_s
                typer.echo(f"engine: {server.engine_url} (answered after {waited:.0f} s)")
            while not stop.wait(0.5):
                pass
        except EngineAddressError as exc:
            raise CommandError(
                EXIT_USAGE if exc.status == 400 else EXIT_COULD_NOT_RUN, f"tapdeck serve: {exc}"
            ) from None
        finally:
            typer.echo("stopping…", err=True)
            server.stop()


def _where_the_key_is(server: LocalServer, path: Path) -> str:
    """Where a generated admin key lives, said truly: the file may hold another server's key."""
    if not server.admin_key_written:
        return f"not written to {path}: the server already running on this data dir keeps its key there"
    if server.admin_key_kept:
        return f"kept from {path}: clients of the previous server on this data dir reconnect with it"
    return f"also in {path}"
