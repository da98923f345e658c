"""Shared test fixtures: recorded vLLM bodies and the embedded engine.

Test modules import the helpers as `from tests.conftest import FIXTURES, vllm_fixture,
assert_same_shape` (pytest runs with --import-mode=importlib, which registers this module as
`tests.conftest`).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# Servers started by tests share embedded engines among themselves, never with one running on the
# machine outside the test run (runner/engine/registry.py).
if "TAPDECK_ENGINE_REGISTRY" not in os.environ:
    os.environ["TAPDECK_ENGINE_REGISTRY"] = tempfile.mkdtemp(prefix="tapdeck-test-engines-")
    atexit.register(shutil.rmtree, os.environ["TAPDECK_ENGINE_REGISTRY"], True)

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"


def vllm_fixture(name: str) -> dict[str, Any]:
    """A recorded vLLM exchange by file name, `.json` optional (`"chat_basic"`, `"tiny/chat_basic"`)."""
    path = FIXTURES / (name if name.endswith(".json") else f"{name}.json")
    return json.loads(path.read_text())


def vllm_reply_to(body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """A copy of a recorded reply as vLLM answers `body`: a request that asked for no logprobs gets
    no prompt ids, token ids or logprobs."""
    reply = copy.deepcopy(reply)
    if not body.get("logprobs"):
        reply.pop("prompt_token_ids", None)
        for choice in reply["choices"]:
            choice["logprobs"] = None
            choice.pop("token_ids", None)
    return reply


def vllm_error_case(case: str) -> tuple[int, dict[str, Any]]:
    """Status and body of one recorded case of errors.json (`"unknown_model"`, ...)."""
    for c in vllm_fixture("errors")["cases"]:
        if c["case"] == case:
            return c["status"], c["body"]
    raise KeyError(case)


def assert_same_shape(ours: Any, recorded: Any, path: str = "$", *,
                      mappings: tuple[str, ...] = ()) -> None:
    """Assert `ours` has the structure of a recorded vLLM body: the same keys at every level and
    the same JSON type for every value (null vs null, int vs int, float vs float; numbers may be
    either int or float where vLLM wrote a float). Lists are compared element by element, using
    the recorded list's first element for extra elements of ours. Objects under a key named in
    `mappings` are data maps (pass `("top_logprobs",)` for legacy completions, whose entries are
    `{token: logprob}`): only their
    value types are compared.
    """
    if isinstance(recorded, dict) and path.split(".")[-1].split("[")[0] in mappings:
        assert isinstance(ours, dict), f"{path}: expected an object, got {type(ours).__name__}"
        sample = next(iter(recorded.values()), None)
        for key, value in ours.items():
            assert isinstance(key, str)
            if sample is not None:
                assert_same_shape(value, sample, f"{path}[{key!r}]", mappings=mappings)
    elif isinstance(recorded, dict):
        assert isinstance(ours, dict), f"{path}: expected an object, got {type(ours).__name__}"
        assert set(ours) == set(recorded), (
            f"{path}: keys differ: missing {sorted(set(recorded) - set(ours))}, "
            f"extra {sorted(set(ours) - set(recorded))}")
        for key in recorded:
            assert_same_shape(ours[key], recorded[key], f"{path}.{key}", mappings=mappings)
    elif isinstance(recorded, list):
        assert isinstance(ours, list), f"{path}: expected a list, got {type(ours).__name__}"
        if recorded:
            for i, item in enumerate(ours):
                assert_same_shape(item, recorded[min(i, len(recorded) - 1)], f"{path}[{i}]",
                                  mappings=mappings)
    elif recorded is None:
        assert ours is None, f"{path}: expected null, got {ours!r}"
    elif isinstance(recorded, bool):
        assert isinstance(ours, bool), f"{path}: expected a bool, got {ours!r}"
    elif isinstance(recorded, int):
        assert isinstance(ours, int) and not isinstance(ours, bool), (
            f"{path}: expected an int, got {ours!r}")
    elif isinstance(recorded, float):
        assert isinstance(ours, (int, float)) and not isinstance(ours, bool), (
            f"{path}: expected a number, got {ours!r}")
    else:
        assert type(ours) is type(recorded), (
            f"{path}: expected {type(recorded).__name__}, got {type(ours).__name__} ({ours!r})")


def free_port() -> int:
    """A loopback port nobody holds right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dead_engine_url() -> str:
    """A loopback engine URL where nothing listens."""
    return f"http://127.0.0.1:{free_port()}/v1"


@pytest.fixture(scope="session")
def embedded_engine() -> Iterator[Any]:
    """The embedded engine (SmolLM2-135M) on a free loopback port, shared by the whole session.

    `.base_url` is `http://127.0.0.1:PORT/v1`, `.served_name` is `"smollm2"`.
    """
    pytest.importorskip("llama_cpp", reason="the embedded engine needs llama-cpp-python")
    from tapdeck.runner.engine.embedded import EmbeddedEngine

    engine = EmbeddedEngine().start()
    try:
        yield engine
    finally:
        engine.stop()


@contextlib.contextmanager
def models_only_engine(path: str = "/v1") -> Iterator[str]:
    """A loopback server answering only `GET {path}/models`, with the recorded vLLM listing: an
    engine address that settles, whose model calls fail. Yields `http://127.0.0.1:PORT` (no path)."""
    from fastapi import FastAPI

    from tapdeck.proxy.serving import ThreadedServer

    listing = vllm_fixture("models")["models"]["response"]
    app = FastAPI()
    app.get(f"{path}/models")(lambda: listing)
    server = ThreadedServer(app, "127.0.0.1", 0, name="models-only-engine").start()
    try:
        yield server.url
    finally:
        server.stop()


@contextlib.contextmanager
def local_server_on(engine: Any, data_dir: Path, **config: Any) -> Iterator[Any]:
    """A full LocalServer (capture proxy, admin API, runner routes) whose default engine is `engine`
    (more `ServerConfig` fields in `config`)."""
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.config import ServerConfig

    server = LocalServer(ServerConfig(port=0, data_dir=data_dir, engine_url=engine.base_url,
                                      engine_model=engine.served_name, **config)).start()
    try:
        yield server
    finally:
        server.stop()



@contextlib.contextmanager
def tapdeck_serve(tapdeck: Path, data_dir: Path, log: Path, *, admin_key: str, engine_url: str,
                  engine_model: str | None = None, env: dict[str, str] | None = None) -> Iterator[Any]:
    """`tapdeck serve` as its own process on a free loopback port, until it answers /health.

    Yields the process with `.url`; terminated (then killed) on exit.
    """
    import socket
    import subprocess
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [str(tapdeck), "serve", "--port", str(port), "--engine", engine_url, "--admin-key", admin_key,
            "--data-dir", str(data_dir)]
    if engine_model:
        argv += ["--engine-model", engine_model]
    with log.open("w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", **(env or {})})
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
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
