"""Harbor's dataset registry as a test can have it offline: Harbor's own registry clients (Supabase's
PostgREST over HTTP) are pointed at a loopback address with REGISTRY_URL_VAR, which Harbor reads
when it is imported, so only a fresh process (the command line) sees it."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

REGISTRY_URL_VAR = "HARBOR_SUPABASE_URL"


@contextlib.contextmanager
def registry_knowing_no_dataset() -> Iterator[str]:
    """A registry that answers every query with no rows, as the real one does for a name it does
    not hold; yields its URL."""
    from fastapi import FastAPI

    from tapdeck.proxy.http.uvicorn_thread import ThreadedServer

    app = FastAPI()
    app.api_route("/{path:path}", methods=["GET", "POST"])(lambda path: [])
    server = ThreadedServer(app, "127.0.0.1", 0, name="empty-harbor-registry").start()
    try:
        yield server.url
    finally:
        server.stop()


@contextlib.contextmanager
def registry_never_answering() -> Iterator[str]:
    """A registry address whose connections are taken (queued by the kernel) but never answered;
    yields its URL."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield f"http://127.0.0.1:{held.getsockname()[1]}"
