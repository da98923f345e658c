"""A full tapdeck server (capture proxy, admin API, runner routes) in this process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tapdeck.app.host import LocalServer
from tapdeck.proxy.config import ServerConfig
from tests.support.fake_vllm import FakeVllm


@contextlib.contextmanager
def local_server_on(engine: Any, data_dir: Path, **config: Any) -> Iterator[LocalServer]:
    """A LocalServer whose default engine is `engine` (anything with `.base_url` and
    `.served_name`; more `ServerConfig` fields in `config`)."""
    server = LocalServer(
        ServerConfig(
            port=0, data_dir=data_dir, engine_url=engine.base_url, engine_model=engine.served_name, **config
        )
    ).start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def running(config: ServerConfig) -> Iterator[tuple[LocalServer, httpx.Client]]:
    """A LocalServer started on `config` (a restart when its data dir was used before), with an
    admin client; both closed at the end."""
    server = LocalServer(config).start()
    try:
        with httpx.Client(
            base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {server.admin_key}"}
        ) as admin:
            yield server, admin
    finally:
        server.stop()


@contextlib.contextmanager
def server_with_upstream(data_dir: Path, **overrides: Any) -> Iterator[tuple[FakeVllm, LocalServer]]:
    """A started fake vLLM and a server using it as its engine, for a module to share."""
    with FakeVllm() as up:
        server = LocalServer(
            ServerConfig(host="127.0.0.1", port=0, engine_url=up.base_url, data_dir=data_dir, **overrides)
        ).start()
        try:
            yield up, server
        finally:
            server.stop()
