"""`tapdeck rollout` on the embedded engine another tapdeck process already serves (found through
the engine registry): it says whose engine it uses, and when that engine goes away mid-run it
cancels the run and exits 1 naming the cause, instead of failing every model call against it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN

pytestmark = pytest.mark.slow

OWNER = """
import sys
from tapdeck.runner.engine.registry import acquire_embedded_engine

engine = acquire_embedded_engine()
print(engine.base_url, flush=True)
sys.stdin.read()
"""


def _kill_once_a_run_exists(owner: subprocess.Popen, runs: Path) -> None:
    """Kill -9 the engine's owner as soon as the run's directory exists (bounded)."""
    for _ in range(3000):
        if runs.is_dir() and any(runs.iterdir()):
            os.kill(owner.pid, signal.SIGKILL)
            owner.wait(30)  # reaped, as its own parent would: no longer a process at all
            return
        time.sleep(0.1)


def test_rollout_names_the_reused_engine_and_stops_when_it_goes_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("llama_cpp", reason="the embedded engine needs llama-cpp-python")
    registry = tmp_path / "registry"
    monkeypatch.setenv("TAPDECK_ENGINE_REGISTRY", str(registry))
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TAPDECK_ENGINE_REGISTRY": str(registry)},
    )
    try:
        base_url = owner.stdout.readline().strip()  # type: ignore[union-attr]
        assert base_url.startswith("http://127.0.0.1:"), "the owner never started its engine"
        data = tmp_path / "data"
        killer = threading.Thread(target=_kill_once_a_run_exists, args=(owner, data / "runs"))
        killer.start()
        results: list[Any] = []
        # In a thread of its own: a command that never notices the engine is gone fails this
        # test at the join's bound instead of hanging it.
        follower = threading.Thread(
            target=lambda: results.append(
                CliRunner().invoke(app, ["rollout", "--data-dir", str(data), "--timeout", "600"])
            ),
            daemon=True,
        )
        follower.start()
        follower.join(600)
        killer.join()
    finally:
        owner.kill()
        owner.wait(30)
    assert not follower.is_alive(), "tapdeck rollout never noticed that its engine went away"
    [result] = results
    text = " ".join(result.output.split())
    assert f"using the embedded engine already served by pid {owner.pid} at {base_url}" in text
    assert "started the embedded engine" not in text
    assert result.exit_code == EXIT_COULD_NOT_RUN, result.output
    # Why depends on when it is asked: the process is gone, or its port no longer answers.
    assert f"the embedded engine served by pid {owner.pid} at {base_url} went away mid-run (" in text
    assert "tapdeck rollout --resume run-" in text and "runs " in text and " again (on an engine" in text
    # Who notices first is a race: the command's poll (it cancels the run), or the rollout's own
    # model call (the run ends with the rollout engine_unreachable). Both rerun on resume.
    if "the run was cancelled" in text:
        assert "cancelled" in result.stdout  # the table
    else:
        assert "1 rollout(s) ended engine_unreachable" in text
        assert "engine_unrea" in result.stdout  # the table's error column


def test_a_reused_engine_is_gone_when_its_owner_exits_or_its_port_refuses_but_not_when_busy(
    dead_engine_url: str,
) -> None:
    from tapdeck.runner.engine.registry import SharedEngine
    from tests.support.fake_vllm import FakeVllm

    exited = subprocess.Popen(["true"])
    exited.wait()
    # Its listing takes longer than the check waits: an engine busy generating.
    with FakeVllm(listing_delay=60) as busy:
        assert SharedEngine(busy.base_url, "smollm2", 2048, owner_pid=os.getpid()).gone() is None
    refused = SharedEngine(dead_engine_url, "smollm2", 2048, owner_pid=os.getpid()).gone()
    assert refused == f"it no longer answers at {dead_engine_url} (ConnectError)"
    owner_gone = SharedEngine(dead_engine_url, "smollm2", 2048, owner_pid=exited.pid).gone()
    assert owner_gone == f"process {exited.pid}, which served it, has exited"
