"""Rollouts through the real server, the real Harbor package and the host sandbox.

Every failure comes back as a classified result (`ok: false`, `error_kind`), never an exception.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from tests.support.runner_server import RunnerServer, make_task, runner_server_on

pytestmark = pytest.mark.slow


def _only(doc: dict) -> dict:
    assert len(doc["rollouts"]) == 1, doc
    return doc["rollouts"][0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_oracle_on_a_sample_task_through_the_batch_api(runner_server: RunnerServer) -> None:
    doc = runner_server.run(harness="oracle", tasks=["hello-file"], k=2, concurrency=2, timeout_s=120)
    assert doc["state"] == "finished"
    assert doc["counts"] == {"total": 2, "done": 2, "ok": 2, "failed": 0, "running": 0, "degenerate": 0}
    assert doc["mean_reward"] == 1.0 and doc["pass_rate"] == 1.0
    for r in doc["rollouts"]:
        assert r["ok"] and r["reward"] == 1.0 and r["rewards"] == {"reward": 1.0}
        assert r["group"] == 0 and r["phase"] == "done" and r["error_kind"] is None
        assert r["session_id"] is None  # oracle makes no model calls: nothing to capture
        assert {"environment_setup", "agent_execution", "verifier", "total"} <= set(r["timings"])
    assert sorted(r["index"] for r in doc["rollouts"]) == [0, 1]
    run_dir = Path(doc["path"])
    assert (run_dir / "plan.json").is_file()
    assert len((run_dir / "results.jsonl").read_text().splitlines()) == 2
    assert all((run_dir / "trials" / r["rollout_id"] / "result.json").is_file() for r in doc["rollouts"])


def test_engine_down_is_engine_unreachable(runner_server: RunnerServer) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    r = _only(runner_server.run(tasks=["hello-file"], engine=url, timeout_s=120))
    assert not r["ok"] and r["error_kind"] == "engine_unreachable"
    assert r["reward"] is None and url.rsplit("/", 1)[0] in r["error"]
    # The capture session is refused (no engine answered), so no sandbox ever boots.
    assert r["phase"] == "failed" and r["session_id"] is None
    assert f"tried GET {url}/models" in r["error"]


def test_sandbox_start_failure_is_sandbox_failed(runner_server: RunnerServer, tmp_path: Path) -> None:
    r = _only(
        runner_server.run(
            harness="oracle",
            tasks=["hello-file"],
            timeout_s=120,
            sandbox_kwargs={"base_dir": str(tmp_path / "missing" / "dir")},
        )
    )
    assert not r["ok"] and r["error_kind"] == "sandbox_failed"
    assert r["reward"] is None
    assert "sandbox" in r["error"]


def test_agent_timeout_is_agent_timeout_and_still_graded(runner_server: RunnerServer, tmp_path: Path) -> None:
    make_task(tmp_path, "slow-agent", "echo 0 > /logs/verifier/reward.txt\n", agent_timeout_s=1.0)
    # Set in the plan: the embedded engine's per-harness default would raise the task's 1 s to
    # what terminus-2's first prompt needs (source `harness-default`); an operator's value stands.
    r = _only(runner_server.run(dataset=str(tmp_path), timeout_s=120, agent_timeout_s=1.0))
    assert not r["ok"] and r["error_kind"] == "agent_timeout"
    assert r["reward"] == 0.0  # Harbor still verifies after an agent timeout


def test_verifier_writing_garbage_is_verifier_failed_with_null_reward(
    runner_server: RunnerServer, tmp_path: Path
) -> None:
    make_task(tmp_path, "garbage-verifier", "echo 'all good!' > /logs/verifier/reward.txt\n")
    r = _only(runner_server.run(dataset=str(tmp_path), harness="oracle", timeout_s=120))
    assert not r["ok"] and r["error_kind"] == "verifier_failed"
    assert r["reward"] is None
    assert any(f["code"] == "reward_value_dropped" for f in r["findings"])


def test_multi_key_reward_without_a_chosen_key_is_refused(
    runner_server: RunnerServer, tmp_path: Path
) -> None:
    make_task(tmp_path, "two-rewards", 'echo \'{"passed": 1, "style": 0.5}\' > /logs/verifier/reward.json\n')
    r = _only(runner_server.run(dataset=str(tmp_path), harness="oracle", timeout_s=120))
    assert not r["ok"] and r["error_kind"] == "reward_ambiguous"
    assert r["reward"] is None and r["rewards"] == {"passed": 1.0, "style": 0.5}
    assert "passed" in r["error"] and "style" in r["error"]
    chosen = _only(
        runner_server.run(dataset=str(tmp_path), harness="oracle", timeout_s=120, reward_key="style")
    )
    assert chosen["ok"] and chosen["reward"] == 0.5 and chosen["reward_key"] == "style"


def test_outer_timeout_covers_the_whole_rollout(runner_server: RunnerServer) -> None:
    r = _only(runner_server.run(tasks=["hello-file"], timeout_s=2))
    assert not r["ok"] and r["error_kind"] == "timeout"
    assert r["reward"] is None


def test_a_host_sandbox_rollout_cannot_see_or_change_the_data_dir(embedded_engine, tmp_path: Path) -> None:
    # Outside /tmp, which every host sandbox trial already has its own of (as ~/.tapdeck is).
    data_dir = Path(tempfile.mkdtemp(prefix="tapdeck-data-", dir="/var/tmp"))
    look = (
        f"ls -A {data_dir}; cat {data_dir}/capture.db {data_dir}/runs/*/plan.json; "
        f"touch {data_dir}/planted; echo end"
    )
    task = make_task(
        tmp_path,
        "peek-data-dir",
        f"{{ {look}; }} > /logs/verifier/seen.txt 2>/dev/null\necho 1 > /logs/verifier/reward.txt\n",
    )
    (task / "solution" / "solve.sh").write_text(
        f"#!/bin/bash\n{{ {look}; }} > /logs/agent/seen.txt 2>/dev/null\n"
    )
    try:
        with runner_server_on(embedded_engine, data_dir) as server:
            r = _only(server.run(dataset=str(tmp_path), harness="oracle", timeout_s=120))
        assert r["ok"], r
        trial = data_dir / "runs" / r["run_id"] / "trials" / r["rollout_id"]
        assert (trial / "agent" / "seen.txt").read_text().split() == ["end"]
        assert (trial / "verifier" / "seen.txt").read_text().split() == ["end"]
        assert not (data_dir / "planted").exists()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.mark.parametrize("harness", ["codex", "oracle"])
def test_a_data_dir_holding_the_agent_installs_stays_visible_to_an_agent_cli_only(
    harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hiding a data dir that holds TAPDECK_AGENTS_DIR would hide the agent CLI from its own trial
    (its set-up check then fails); a harness that runs no CLI from there keeps it hidden."""
    from tapdeck.runner.rollout import RolloutSpec, host_sandbox_kwargs
    from tapdeck.schema.runs import RolloutTemplate

    data_dir = tmp_path / "tapdeck"
    monkeypatch.setenv("TAPDECK_AGENTS_DIR", str(data_dir / "agents"))
    spec = RolloutSpec(
        task="t",
        task_path=tmp_path,
        trials_dir=tmp_path / "trials",
        rollout=RolloutTemplate(harness=harness),
        data_dir=data_dir,
    )
    hidden = host_sandbox_kwargs(spec, "http://127.0.0.1:8300/v1").get("hidden_paths", [])
    assert hidden == ([] if harness == "codex" else [str(data_dir)])
    monkeypatch.setenv("TAPDECK_AGENTS_DIR", str(tmp_path / "elsewhere"))
    assert host_sandbox_kwargs(spec, "http://127.0.0.1:8300/v1")["hidden_paths"] == [str(data_dir)]


def test_a_task_needing_compose_services_is_bad_task_naming_them(
    runner_server: RunnerServer, tmp_path: Path
) -> None:
    task = make_task(tmp_path, "needs-a-database", "echo 1 > /logs/verifier/reward.txt\n")
    (task / "environment" / "docker-compose.yaml").write_text(
        "services:\n  main:\n    build: .\n  db:\n    image: postgres:16\n"
    )
    r = _only(runner_server.run(dataset=str(tmp_path), harness="oracle", timeout_s=120))
    assert not r["ok"] and r["error_kind"] == "bad_task" and r["reward"] is None
    assert "cannot start compose service(s) db: use a container sandbox" in r["error"]
    assert "Traceback" not in r["error"]
