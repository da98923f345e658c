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


def process_gone(pid: int) -> bool:
    """True when `pid` no longer runs (a zombie nobody reaped yet counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def free_port() -> int:
    """A loopback port nobody holds right now, for a process to bind a moment later.

    Picked below the kernel's ephemeral range where it can: a port the kernel hands out (bind to
    port 0, or the local end of any outgoing connection, this run's or another's) could be taken
    in between, and the server started on it would find it in use."""
    import random

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    for _ in range(100 if low > 11_000 else 0):
        port = random.SystemRandom().randrange(10_000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
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

    from tapdeck.proxy.http.uvicorn_thread import ThreadedServer

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
def tapdeck_serve(tapdeck: Path, data_dir: Path, log: Path, *, admin_key: str | None, engine_url: str,
                  engine_model: str | None = None, env: dict[str, str] | None = None) -> Iterator[Any]:
    """`tapdeck serve` as its own process on a free loopback port, until it answers /health.
    `admin_key` None: the server generates one and writes `<data_dir>/admin.key`.

    Yields the process with `.url`; terminated (then killed) on exit.
    """
    import subprocess
    import time

    import httpx

    port = free_port()
    argv = [str(tapdeck), "serve", "--port", str(port), "--engine", engine_url, "--data-dir", str(data_dir)]
    if admin_key is not None:
        argv += ["--admin-key", admin_key]
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


class SandboxProcesses:
    """Every process of the host-sandbox trials that process `pid` has running now, found by mount
    namespace (so a daemon that left the process tree, such as a tmux server, still counts).

    Each namespace is held open while this lives: a dead namespace's id is reused at once, and
    without the pin a later trial could be mistaken for a survivor.
    """

    def __init__(self, pid: int) -> None:
        own = os.readlink(f"/proc/{pid}/ns/mnt")
        self.pins: dict[str, int] = {}
        for child in _descendants(pid):
            with contextlib.suppress(OSError):
                fd = os.open(f"/proc/{child}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
                namespace = os.readlink(f"/proc/self/fd/{fd}")
                if namespace == own or namespace in self.pins:
                    os.close(fd)
                else:
                    self.pins[namespace] = fd

    def commands(self) -> list[str]:
        """The command name of every process in the pinned namespaces."""
        from tapdeck.runner.sandboxes.namespaces import processes_in_namespace

        names = []
        for namespace in self.pins:
            for pid in processes_in_namespace(namespace):
                with contextlib.suppress(OSError):
                    names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        return names

    def survivors(self, attempts: int = 300) -> list[str]:
        """Commands still running in the pinned namespaces once they empty or `attempts` checks
        (0.1 s apart) pass: killed processes take a moment to be reaped."""
        import time

        for _ in range(attempts):
            left = self.commands()
            if not left:
                return []
            time.sleep(0.1)
        return left

    def close(self) -> None:
        """Kill whatever is left (a failing test leaves nothing running) and drop the pins."""
        from tapdeck.runner.sandboxes.namespaces import processes_in_namespace

        for namespace, fd in self.pins.items():
            for pid in processes_in_namespace(namespace):
                with contextlib.suppress(OSError):
                    os.kill(pid, 9)
            os.close(fd)
        self.pins = {}


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` in the process tree (from /proc's PPid fields)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{entry}/status").read_text().splitlines():
                    if line.startswith("PPid:"):
                        parents[int(entry)] = int(line.split()[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        frontier += children
    return found


@contextlib.contextmanager
def hanging_engine(hold_s: float = 600.0) -> Iterator[Any]:
    """A loopback vLLM-shaped engine that probes fine (the recorded listing; one-token probe calls
    get the recorded reply) and never answers any other call: each is held until its client hangs
    up or `hold_s` passes. Yields it with `.base_url` (`…/v1`), `.served_name` and `.held` (calls
    held now)."""
    import asyncio
    import types

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, Response

    from tapdeck.proxy.http.uvicorn_thread import ThreadedServer

    listing = vllm_fixture("models")["models"]["response"]
    basic = vllm_fixture("chat_basic")["response"]
    state = types.SimpleNamespace(held=0, base_url="", served_name=listing["data"][0]["id"])
    app = FastAPI()
    app.get("/v1/models")(lambda: listing)

    async def chat(request):  # a plain Starlette route: the annotations here are strings
        body = await request.json()
        if body.get("max_tokens") == 1:
            return JSONResponse(vllm_reply_to(body, basic))
        state.held += 1
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + hold_s
            while loop.time() < deadline and not await request.is_disconnected():
                await asyncio.sleep(0.05)
        finally:
            state.held -= 1
        return Response(status_code=499)

    app.router.add_route("/v1/chat/completions", chat, methods=["POST"])
    server = ThreadedServer(app, "127.0.0.1", 0, name="hanging-engine").start()
    state.base_url = f"{server.url}/v1"
    try:
        yield state
    finally:
        server.stop()
