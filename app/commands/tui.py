"""`tapdeck` (no command) / `tapdeck tui`: the TUI on an embedded server started in this process.

The server (`LocalServer`: capture proxy, admin API, runner routes, embedded engine) runs on loopback
in its own thread; the TUI talks to it over HTTP exactly as `tapdeck attach` talks to a remote one.
"""

from __future__ import annotations

import io
import logging
import ssl
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from tapdeck.app.commands.options import (
    DataDirOption,
    EngineApiKeyOption,
    EngineModelOption,
    EngineWaitOption,
    PublicUrlOption,
    TlsKeyOption,
    engine_option,
    tls_cert_option,
)
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_USAGE, CommandError
from tapdeck.proxy.config import DEFAULT_ENGINE_WAIT_S

if TYPE_CHECKING:
    from tapdeck.app.host import LocalServer
    from tapdeck.app.server_links import ServerLink
    from tapdeck.app.tui import TapdeckApp
    from tapdeck.proxy.upstream.address import EngineAddressError


def _log_to_file(path: Path) -> logging.Handler:
    """Send all logging to a file while the TUI owns the terminal (stderr would tear the screen)."""
    from tapdeck.proxy.store.no_follow import open_append

    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, delay=True)
    # Never through a link (proxy/store/no_follow.py). Its TextIO is os.fdopen's TextIOWrapper, the
    # stream type FileHandler is declared with.
    handler.setStream(cast(io.TextIOWrapper, open_append(path)))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


def run_app(
    base_url: str,
    admin_key: str | None,
    *,
    server_label: str,
    settings_path: Path,
    server_name: str = "",
    others: Sequence[ServerLink] = (),
    owns_server: bool = False,
    verify: ssl.SSLContext | bool = True,
    before: Callable[[TapdeckApp], None] | None = None,
) -> None:
    """Run the App against a server URL (shared by embedded and attached mode), and `others` (more
    servers attached at once, `server_name` naming this one beside them); `verify`: what an
    https server's certificate is checked against; `before` is given the App before it runs."""
    from tapdeck.app.client import TapdeckClient
    from tapdeck.app.tui import TapdeckApp

    app = TapdeckApp(
        TapdeckClient(base_url, admin_key, verify=verify),
        server_label=server_label,
        server_name=server_name,
        others=others,
        settings_path=settings_path,
        owns_server=owns_server,
    )
    if before is not None:
        before(app)
    app.run()


class EngineWatch:
    """While the embedded server waits for its engine: "waiting for the engine at URL (N s)" in
    the log every 10 s (the TUI's status line says it on screen), and the TUI ended when the wait
    runs out, with the refusal kept for the command's one line."""

    def __init__(self, server: LocalServer) -> None:
        self.server = server
        self.failure: EngineAddressError | None = None
        self.done = threading.Event()

    def start(self, app: TapdeckApp) -> None:
        threading.Thread(target=self._watch, args=(app,), name="tapdeck-engine-watch", daemon=True).start()

    def _watch(self, app: TapdeckApp) -> None:
        from tapdeck.proxy.upstream.address import EngineAddressError

        try:
            self.server.wait_for_engine(logging.getLogger("tapdeck.tui").info, stop=self.done)
        except EngineAddressError as exc:
            self.failure = exc
            while not self.done.is_set():  # the App may not run yet: it ends once it does
                try:
                    app.call_from_thread(app.exit)
                    return
                except RuntimeError:
                    self.done.wait(0.1)


def run_embedded(
    data_dir: Path | None = None,
    *,
    port: int = 0,
    engine_url: str | None = None,
    engine_model: str | None = None,
    engine_api_key: str | None = None,
    engine_wait_s: float = DEFAULT_ENGINE_WAIT_S,
    public_url: str | None = None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
) -> None:
    """Start a LocalServer on loopback (any free port by default), run the TUI on it, stop it on exit.
    With a certificate and key it serves HTTPS (sandboxes reaching it through `public_url`). An
    engine URL that does not answer yet is waited for up to `engine_wait_s` with the TUI up."""
    from pydantic import ValidationError

    from tapdeck.app.failures import validation_line
    from tapdeck.app.host import LocalServer
    from tapdeck.app.settings import default_settings_path
    from tapdeck.app.tui import TapdeckApp  # noqa: F401 - import the UI before starting anything
    from tapdeck.proxy.config import ConfigError, ServerConfig, TlsFiles, default_data_dir
    from tapdeck.proxy.http.uvicorn_thread import PortInUseError
    from tapdeck.proxy.upstream.address import EngineAddressError, normalize_address, shown_url

    data_dir = (data_dir or default_data_dir()).expanduser()
    if (tls_cert is None) != (tls_key is None):
        raise CommandError(EXIT_USAGE, "tapdeck: give --tls-cert and --tls-key together")
    tls = TlsFiles(cert=tls_cert.expanduser(), key=tls_key.expanduser()) if tls_cert and tls_key else None
    try:
        config = ServerConfig(
            host="127.0.0.1",
            port=port,
            data_dir=data_dir,
            engine_url=engine_url,
            engine_model=engine_model,
            engine_api_key=engine_api_key,
            engine_wait_s=engine_wait_s,
            public_url=public_url,
            tls=tls,
        )
        if engine_url:  # a malformed address is refused before the server is said to start
            normalize_address(engine_url)
    except ValidationError as exc:  # bad usage, as `serve` says it: one line, exit 2
        raise CommandError(EXIT_USAGE, f"tapdeck: {validation_line(exc)}") from None
    except EngineAddressError as exc:
        raise CommandError(EXIT_USAGE, f"tapdeck: {exc}") from None
    _log_to_file(data_dir / "tui.log")
    print(
        "tapdeck: starting the embedded server "
        f"({'engine ' + engine_url if engine_url else 'embedded engine'}, data in {data_dir})…",
        file=sys.stderr,
        flush=True,
    )
    server = LocalServer(config)
    try:
        server.start()
    except (ConfigError, PortInUseError) as exc:
        raise CommandError(EXIT_USAGE, f"tapdeck: {exc}") from None
    except EngineAddressError as exc:
        raise CommandError(
            EXIT_USAGE if exc.status == 400 else EXIT_COULD_NOT_RUN, f"tapdeck: {exc}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any start failure is reported as one line, no traceback
        raise CommandError(
            EXIT_COULD_NOT_RUN, f"tapdeck: could not start the embedded server: {exc}"
        ) from None
    watch = EngineWatch(server)
    if engine_url and server.engine_url is None:
        print(f"tapdeck: waiting for the engine at {shown_url(engine_url)}…", file=sys.stderr, flush=True)
    elif engine_url:
        print(f"tapdeck: engine {server.engine_url}", file=sys.stderr, flush=True)
    try:
        run_app(
            server.url,
            server.admin_key,
            server_label=f"embedded {server.url}",
            settings_path=default_settings_path(data_dir),
            owns_server=True,
            verify=server.client_trust,
            before=watch.start,
        )
    finally:
        watch.done.set()
        server.stop()
    if watch.failure is not None:
        raise CommandError(
            EXIT_USAGE if watch.failure.status == 400 else EXIT_COULD_NOT_RUN, f"tapdeck: {watch.failure}"
        )


PortOption = Annotated[
    int, typer.Option("--port", min=0, max=65535, help="Loopback port of the embedded server (0 = any free).")
]
EngineOption = Annotated[
    str | None,
    engine_option(
        "Engine, e.g. a vLLM server: HOST:PORT, http://HOST:PORT or …/v1. Omitted: the embedded "
        "SmolLM2 engine (never solves tasks)."
    ),
]
TlsCertOption = Annotated[
    Path | None,
    tls_cert_option(
        "Serve the embedded server over HTTPS with this certificate (PEM); needs --tls-key. For "
        "sandboxes that reach it through --public-url off this host."
    ),
]
"""The TUI's own options, shared by `tapdeck tui` and `tapdeck` with no command (their others are
the ones commands share, in options.py)."""


def register(app: typer.Typer) -> None:
    """Add `tapdeck tui` (the same as `tapdeck` with no command)."""

    @app.command("tui")
    def tui(
        data_dir: DataDirOption = None,
        port: PortOption = 0,
        engine: EngineOption = None,
        engine_model: EngineModelOption = None,
        engine_api_key: EngineApiKeyOption = None,
        engine_wait: EngineWaitOption = DEFAULT_ENGINE_WAIT_S,
        public_url: PublicUrlOption = None,
        tls_cert: TlsCertOption = None,
        tls_key: TlsKeyOption = None,
    ) -> None:
        """Open the TUI on an embedded tapdeck server (what `tapdeck` with no command does)."""
        run_embedded(
            data_dir,
            port=port,
            engine_url=engine,
            engine_model=engine_model,
            engine_api_key=engine_api_key,
            engine_wait_s=engine_wait,
            public_url=public_url,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )
