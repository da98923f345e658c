"""`tapdeck serve` as a process of its own, started from the console script of the environment
running the tests (never another checkout's)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.support.ports import free_port

TAPDECK = Path(sys.executable).with_name("tapdeck")
"""The console script of the environment running the tests."""


def serve_process(port: int, data: Path, engine_url: str) -> subprocess.Popen:
    """A `tapdeck serve` process on `port` with its data in `data` (stdout and stderr piped)."""
    return subprocess.Popen(
        [str(TAPDECK), "serve", "--port", str(port), "--data-dir", str(data), "--engine", engine_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_health(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until the server answers `/health` (an AssertionError if it exits or never comes up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"tapdeck serve exited: {proc.stderr.read().decode()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("tapdeck serve did not come up")


@contextlib.contextmanager
def tapdeck_serve(
    tapdeck: Path,
    data_dir: Path,
    log: Path,
    *,
    admin_key: str | None,
    engine_url: str,
    engine_model: str | None = None,
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> Iterator[Any]:
    """`tapdeck serve` as its own process on loopback (`port`, default a free one), until it
    answers /health. `admin_key` None: the server generates one and writes `<data_dir>/admin.key`.

    Yields the process with `.url`; terminated (then killed) on exit.
    """
    port = port or free_port()
    argv = [str(tapdeck), "serve", "--port", str(port), "--engine", engine_url, "--data-dir", str(data_dir)]
    if admin_key is not None:
        argv += ["--admin-key", admin_key]
    if engine_model:
        argv += ["--engine-model", engine_model]
    with log.open("w") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    process.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{process.url}/health", timeout=5).json().get("status") == "ok":  # type: ignore[attr-defined]
                    break
            except (httpx.HTTPError, ValueError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"tapdeck serve never answered /health; its log:\n{log.read_text()}")
            time.sleep(0.3)
        yield process
    finally:
        stop(process)


def stop(process: subprocess.Popen) -> None:
    """Terminate a process, and kill it if it has not ended 30 s later."""
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
