"""One embedded engine per machine: a second tapdeck process reuses the running engine.

Each test gets its own registry folder; the processes are real (`python -c`), the engines real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

# A process that acquires the machine's engine, says what it got, and holds it until stdin closes.
HOLDER = textwrap.dedent("""
    import json, sys
    from tapdeck.runner.engine.registry import acquire_embedded_engine
    eng = acquire_embedded_engine()
    print(json.dumps({"url": eng.base_url, "owned": eng.owned}), flush=True)
    sys.stdin.read()
    eng.stop()
""")


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("llama_cpp", reason="the embedded engine needs llama-cpp-python")
    folder = tmp_path / "registry"
    monkeypatch.setenv("TAPDECK_ENGINE_REGISTRY", str(folder))
    return folder


def _holder() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )


def _said(proc: subprocess.Popen[str]) -> dict:
    line = proc.stdout.readline()
    assert line, f"holder exited with {proc.wait()}"
    return json.loads(line)


def _release(proc: subprocess.Popen[str]) -> None:
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0


def test_second_process_reuses_the_running_engine(registry: Path) -> None:
    from tapdeck.runner.engine.registry import acquire_embedded_engine

    mine = acquire_embedded_engine()
    try:
        assert mine.owned
        other = _holder()
        try:
            said = _said(other)
            assert said == {"url": mine.base_url, "owned": False}
        finally:
            _release(other)
        # the reusing process left; the engine it borrowed still serves
        assert httpx.get(f"{mine.base_url}/models", timeout=10).status_code == 200
    finally:
        mine.stop()
    assert not (registry / "embedded.json").exists()


def test_two_processes_starting_at_once_share_one_engine(registry: Path) -> None:
    first, second = _holder(), _holder()
    try:
        said = [_said(first), _said(second)]
        assert said[0]["url"] == said[1]["url"]
        assert sorted(s["owned"] for s in said) == [False, True]
    finally:
        for proc in (first, second):
            if proc.stdin and not proc.stdin.closed:
                _release(proc)


def test_engine_of_a_dead_process_is_replaced(registry: Path) -> None:
    from tapdeck.runner.engine.registry import acquire_embedded_engine

    holder = _holder()
    gone = _said(holder)["url"]
    holder.kill()
    holder.wait()
    assert (registry / "embedded.json").exists()  # killed: no chance to withdraw it
    mine = acquire_embedded_engine()
    try:
        assert mine.owned and mine.base_url != gone
        announced = json.loads((registry / "embedded.json").read_text())
        assert announced["pid"] == os.getpid() and announced["base_url"] == mine.base_url
    finally:
        mine.stop()


def test_engine_with_another_context_is_not_reused(registry: Path) -> None:
    from tapdeck.runner.engine.registry import acquire_embedded_engine

    small = acquire_embedded_engine(n_ctx=2048)
    try:
        default = acquire_embedded_engine()
        try:
            assert default.owned and default.base_url != small.base_url
        finally:
            default.stop()
    finally:
        small.stop()


def test_serve_on_a_reused_engine_names_the_process_that_serves_it(registry: Path, tmp_path: Path) -> None:
    # The engine lives as long as its owner, not as long as this server: serve says whose it is.
    holder = _holder()
    serve = None
    try:
        url = _said(holder)["url"]
        serve = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from tapdeck.app.cli import main; main()",
                "serve",
                "--port",
                "0",
                "--data-dir",
                str(tmp_path / "data"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("TAPDECK_ADMIN_KEY")},
        )
        lines: list[str] = []
        while not lines or not lines[-1].startswith("admin key:"):  # serve's last start-up line
            line = serve.stdout.readline()
            assert line, f"serve exited with {serve.wait()} after {lines}"
            lines.append(line.rstrip("\n"))
        assert lines[0].startswith("tapdeck server at ") and f"(engine: {url};" in lines[0]
        assert lines[1] == (
            f"using the embedded engine already served by pid {holder.pid} at "
            f"{url} (it stops when that process does)"
        )
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(timeout=60)
        _release(holder)
