"""`tapdeck rollout --server URL` follows a run by polling the server: a server that goes away
(`kill -9`) is tried again with growing pauses, then given up on with exit 1 and the command that
picks the run up again, instead of spinning on it forever. That command, `--resume RUN`, follows a
run that is still going."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.app.client import ApiError, TapdeckClient
from tapdeck.app.commands import run_follow
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_OK, EXIT_ROLLOUT_FAILED
from tests.support.fake_vllm import models_only_engine
from tests.support.local_server import local_server_on
from tests.support.processes import SandboxProcesses
from tests.support.runner_server import make_task
from tests.support.tapdeck_process import tapdeck_serve

pytestmark = pytest.mark.slow

ADMIN_KEY = "tdk-admin-follow-test-key-0123456789abcdef"


def _kill_once_verifying(server: Any, found: dict[str, Any]) -> None:
    """Kill -9 `server` once its run's rollout is in its (sleeping) verifier (bounded)."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for _ in range(1200):
        try:
            runs = httpx.get(f"{server.url}/admin/runs", headers=headers, timeout=5).json()["runs"]
            detail = (
                httpx.get(f"{server.url}/admin/runs/{runs[0]['id']}", headers=headers, timeout=5).json()
                if runs
                else {}
            )
        except (httpx.HTTPError, ValueError, KeyError):
            detail = {}
        if any(r.get("phase") == "verify" for r in detail.get("rollouts", [])):
            found["run"] = detail["id"]
            found["trial"] = SandboxProcesses(server.pid)
            os.kill(server.pid, signal.SIGKILL)
            return
        time.sleep(0.1)


def test_rollout_follow_gives_up_when_the_server_goes_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_follow, "SERVER_GRACE_S", 3.0)
    unanswered = []
    real_run = TapdeckClient.run

    async def counted_run(self: TapdeckClient, run_id: str) -> Any:
        try:
            return await real_run(self, run_id)
        except ApiError as exc:
            if exc.kind == "unreachable":
                unanswered.append(time.monotonic())
            raise

    monkeypatch.setattr(TapdeckClient, "run", counted_run)
    # The verifier sleeps: the run is still going when the server is killed.
    task = make_task(tmp_path / "tasks", "slow-verifier", "sleep 300\n")
    tapdeck = Path(sys.executable).parent / "tapdeck"
    found: dict[str, Any] = {}
    with (
        models_only_engine() as engine,
        tapdeck_serve(
            tapdeck, tmp_path / "data", tmp_path / "serve.log", admin_key=ADMIN_KEY, engine_url=engine
        ) as server,
    ):
        killer = threading.Thread(target=_kill_once_verifying, args=(server, found))
        killer.start()
        results: list[Any] = []
        # The command runs in a thread of its own, so a follow loop that never gives up fails
        # this test at the join's bound instead of hanging it.
        follower = threading.Thread(
            target=lambda: results.append(
                CliRunner().invoke(
                    app,
                    [
                        "rollout",
                        "--server",
                        server.url,
                        "--admin-key",
                        ADMIN_KEY,
                        "--dataset",
                        str(task),
                        "--harness",
                        "oracle",
                        "--timeout",
                        "600",
                    ],
                )
            ),
            daemon=True,
        )
        follower.start()
        try:
            follower.join(300)
        finally:
            killer.join()
            if "trial" in found:
                found["trial"].close()
    assert not follower.is_alive(), "tapdeck rollout kept following a server that was killed"
    [result] = results
    assert result.exit_code == EXIT_COULD_NOT_RUN, result.output
    text = " ".join(result.output.split())
    assert f"the server at {server.url} went away" in text
    assert f"`tapdeck rollout --resume {found['run']} --server {server.url}`" in text
    assert "Traceback" not in result.output
    # Paused between tries (0.5 s, doubling): a handful of tries in the grace, where the old loop
    # without a pause made thousands.
    assert 2 <= len(unanswered) <= 10, len(unanswered)


def test_resume_of_a_run_still_going_follows_it(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks", "short-wait", "sleep 10\necho 1 > /logs/verifier/reward.txt\n")
    with models_only_engine() as url:
        engine = SimpleNamespace(base_url=f"{url}/v1", served_name="smollm2")
        with local_server_on(engine, tmp_path / "data") as server:
            headers = {"Authorization": f"Bearer {server.admin_key}"}
            run = httpx.post(
                f"{server.url}/admin/runs",
                headers=headers,
                timeout=60,
                json={"dataset": str(task), "rollout": {"harness": "oracle", "timeout_s": 120}},
            ).json()
            result = CliRunner().invoke(
                app,
                ["rollout", "--server", server.url, "--admin-key", server.admin_key, "--resume", run["id"]],
            )
    assert result.exit_code == EXIT_OK, result.output
    assert f"run {run['id']} is running already: following it" in result.output
    assert f"run {run['id']} finished: 1/1 done, 1 ok" in result.output


def test_sigterm_cancels_a_followed_run_as_ctrl_c_does(tmp_path: Path) -> None:
    # The verifier sleeps: the run is still going when the command is told to stop.
    task = make_task(tmp_path / "tasks", "slow-verifier", "sleep 300\n")
    tapdeck = Path(sys.executable).parent / "tapdeck"
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with (
        models_only_engine() as engine,
        tapdeck_serve(
            tapdeck, tmp_path / "data", tmp_path / "serve.log", admin_key=ADMIN_KEY, engine_url=engine
        ) as server,
    ):
        command = subprocess.Popen(
            [
                str(tapdeck),
                "rollout",
                "--server",
                server.url,
                "--admin-key",
                ADMIN_KEY,
                "--dataset",
                str(task),
                "--harness",
                "oracle",
                "--timeout",
                "600",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            run_id = None
            for _ in range(1200):  # until its rollout sleeps in the verifier (bounded)
                runs = httpx.get(f"{server.url}/admin/runs", headers=headers, timeout=5).json()["runs"]
                if runs:
                    run_id = runs[0]["id"]
                    detail = httpx.get(f"{server.url}/admin/runs/{run_id}", headers=headers, timeout=5).json()
                    if any(r.get("phase") == "verify" for r in detail["rollouts"]):
                        break
                time.sleep(0.1)
            else:
                pytest.fail("the rollout never reached its verifier")
            command.send_signal(signal.SIGTERM)
            out, err = command.communicate(timeout=120)
        finally:
            if command.poll() is None:
                command.kill()
        state = httpx.get(f"{server.url}/admin/runs/{run_id}", headers=headers, timeout=5).json()["state"]
    assert command.returncode == EXIT_ROLLOUT_FAILED, out + err
    assert "cancelling (tearing sandboxes down)…" in err and "Traceback" not in err
    assert f"run {run_id} cancelled" in " ".join(out.split()), out
    assert state == "cancelled"
