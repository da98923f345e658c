"""No file tapdeck writes is written through a symbolic link planted in its place: the keys, the
capture store's side files, the TUI's settings, run and training records, exports and append-only
logs each refuse the link, dangling or not, in one line naming it; what the link names is left
exactly as it was (or not created). A data dir that is itself a link keeps working."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tapdeck.app.host import LocalServer
from tapdeck.app.settings import Settings
from tapdeck.proxy.config import ServerConfig
from tapdeck.proxy.store.database import Store
from tapdeck.proxy.store.no_follow import LINK_REFUSED, LinkRefused
from tapdeck.runner.batch import RESULTS, STATE, BatchRunner, RunPlan, rollout_id
from tapdeck.runner.rollout import RolloutSpec
from tapdeck.runner.training import RunRecord, TrainingRun
from tapdeck.schema.runs import RolloutResult

VICTIM = "not tapdeck's\n"


def refusal(path: Path) -> str:
    return f"cannot use {path}: {LINK_REFUSED}"


def plant(path: Path, *, dangling: bool = False) -> Path:
    """A link at `path` to a file outside it (mode 0644, `VICTIM` inside), or to one that does not
    exist; returns what the link names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    target = path.parent.parent / f"target-of-{path.name}"
    if not dangling:
        target.write_text(VICTIM)
        target.chmod(0o644)
    path.symlink_to(target)
    return target


def assert_untouched(target: Path, *, dangling: bool = False) -> None:
    if dangling:
        assert not target.exists() and not target.is_symlink()
    else:
        assert target.read_text() == VICTIM
        assert stat.S_IMODE(target.stat().st_mode) == 0o644


def tapdeck(*args: str, data: Path) -> subprocess.CompletedProcess:
    """`tapdeck ARGS` through the console script's entry point, as a user runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAPDECK_ADMIN_KEY")} | {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "TAPDECK_DATA_DIR": str(data),
        "XDG_CONFIG_HOME": str(data.parent / "config"),
    }
    return subprocess.run(
        [sys.executable, "-c", "from tapdeck.app.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def one_line(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, result.stdout
    return lines[-1]


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
@pytest.mark.parametrize(
    "name", ["admin.key", "admin.key.lock", "capture.db", "capture.db-wal", "capture.db-shm"]
)
def test_a_link_planted_in_the_data_dir_before_the_first_start_stops_the_start(
    tmp_path: Path, name: str, dangling: bool
) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    target = plant(data / name, dangling=dangling)
    server = LocalServer(ServerConfig(port=0, data_dir=data), engine=False)
    with pytest.raises(LinkRefused) as refused:
        server.start()
        server.stop()
    assert str(refused.value) == refusal(data / name)
    assert_untouched(target, dangling=dangling)
    assert (data / name).is_symlink()


@pytest.mark.medium
def test_serve_refuses_an_admin_key_link_in_one_line(tmp_path: Path, dead_engine_url: str) -> None:
    data = tmp_path / "data"
    target = plant(data / "admin.key")
    result = tapdeck("serve", "--port", "0", "--engine", dead_engine_url, "--data-dir", str(data), data=data)
    assert result.returncode == 1
    assert one_line(result) == f"tapdeck serve: {refusal(data / 'admin.key')}"
    assert_untouched(target)


def test_a_data_dir_that_is_itself_a_link_is_used(tmp_path: Path) -> None:
    # Operators link ~/.tapdeck to a bigger disk: only the files tapdeck makes inside are refused.
    real = tmp_path / "big-disk" / "tapdeck"
    real.mkdir(parents=True)
    (tmp_path / "data").symlink_to(real, target_is_directory=True)
    with LocalServer(ServerConfig(port=0, data_dir=tmp_path / "data"), engine=False) as server:
        assert (real / "admin.key").read_text() == server.admin_key + "\n"
    assert (real / "capture.db").is_file() and not (real / "capture.db").is_symlink()


@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
@pytest.mark.parametrize("read_only", [False, True], ids=["writer", "reader"])
def test_the_store_refuses_a_linked_side_file_before_sqlite_opens_it(
    tmp_path: Path, suffix: str, read_only: bool
) -> None:
    db = tmp_path / "data" / "capture.db"
    Store(db).close()  # a store with no side files left: SQLite removes them on the last close
    target = plant(Path(f"{db}{suffix}"), dangling=True)
    with pytest.raises(LinkRefused) as refused:
        Store(db, read_only=read_only).close()
    assert str(refused.value) == refusal(Path(f"{db}{suffix}"))
    assert_untouched(target, dangling=True)


def test_tui_settings_are_not_saved_through_a_link(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "data" / "tui.json"
    target = plant(path)
    with caplog.at_level(logging.WARNING, logger="tapdeck.settings"):
        Settings(theme="nord").save(path)
    assert_untouched(target)
    assert [r.getMessage() for r in caplog.records] == [f"the TUI's settings were not saved: {refusal(path)}"]


async def _run(data: Path) -> tuple[str, Path]:
    created = await BatchRunner(None, data_dir=data, default_engine=None).create(
        RunPlan(harness="oracle", tasks=["hello-file"], k=1)
    )
    return created.id, Path(created.path)


async def _rollout(service: Any, spec: RolloutSpec, **_: Any) -> RolloutResult:
    return RolloutResult(
        rollout_id=spec.rollout_id,
        run_id=spec.run_id,
        task=spec.task,
        index=spec.index,
        ok=True,
        reward=1.0,
        phase="done",
        finished_at=1.0,
    )


async def test_a_run_record_is_not_replaced_through_a_link(tmp_path: Path) -> None:
    run_id, run_dir = await _run(tmp_path / "data")
    (run_dir / STATE).unlink()
    target = plant(run_dir / STATE)
    runner = BatchRunner(None, data_dir=tmp_path / "data", default_engine=None, rollout_fn=_rollout)
    with pytest.raises(LinkRefused) as refused:
        await runner.start(run_id)
    assert str(refused.value) == refusal(run_dir / STATE)
    assert_untouched(target)


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
async def test_a_result_is_not_appended_through_a_link(tmp_path: Path, dangling: bool) -> None:
    run_id, run_dir = await _run(tmp_path / "data")
    target = plant(run_dir / RESULTS, dangling=dangling)
    runner = BatchRunner(None, data_dir=tmp_path / "data", default_engine=None, rollout_fn=_rollout)
    runner.start(run_id)
    summary = await runner.wait(run_id)
    assert (summary.state, summary.error) == ("failed", f"LinkRefused: {refusal(run_dir / RESULTS)}")
    assert_untouched(target, dangling=dangling)


async def test_a_run_export_the_server_refuses_says_why_in_its_reply(tmp_path: Path) -> None:
    data = tmp_path / "data"
    run_id, run_dir = await _run(data)
    (run_dir / RESULTS).write_text(
        RolloutResult(
            rollout_id=rollout_id(run_id, 0, 0),
            run_id=run_id,
            task="hello-file",
            index=0,
            ok=True,
            reward=1.0,
            phase="done",
            finished_at=1.0,
        ).model_dump_json()
        + "\n"
    )
    target = plant(run_dir / "export.jsonl")
    with LocalServer(ServerConfig(port=0, data_dir=data), engine=False) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            reply = await client.post(
                f"/admin/runs/{run_id}/export", headers={"authorization": f"Bearer {server.admin_key}"}
            )
    assert (reply.status_code, reply.json()["detail"]) == (500, refusal(run_dir / "export.jsonl"))
    assert_untouched(target)


def test_a_training_record_is_not_replaced_through_a_link(tmp_path: Path) -> None:
    run_dir = tmp_path / "data" / "train" / "t-1"
    target = plant(run_dir / "run.json")
    record = RunRecord(
        run_id="t-1",
        recipe="data-check",
        argv=["python"],
        env={},
        cwd=str(tmp_path),
        run_dir=str(run_dir),
        trackio_dir=str(run_dir / "trackio"),
        trackio_project="tapdeck",
    )
    with pytest.raises(LinkRefused) as refused:
        record.save()
    assert str(refused.value) == refusal(run_dir / "run.json")
    assert_untouched(target)


@pytest.mark.parametrize("name", ["run.json", "train.log"])
def test_a_training_run_with_a_link_for_its_record_or_log_does_not_start(tmp_path: Path, name: str) -> None:
    data = tmp_path / "data"
    target = plant(data / "train" / "t-1" / name, dangling=True)
    job = TrainingRun(
        "data-check",
        ["--rows", str(tmp_path / "none.jsonl")],
        data_dir=data,
        run_id="t-1",
        python=sys.executable,
        preamble=["exported: none"],
    )
    with pytest.raises(LinkRefused) as refused:
        job.start()
    assert str(refused.value) == refusal(data / "train" / "t-1" / name)
    assert job.pid is None
    assert_untouched(target, dangling=True)


@pytest.mark.medium
@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
def test_export_out_refuses_a_link_in_one_line(tmp_path: Path, dangling: bool) -> None:
    data = tmp_path / "data"
    data.mkdir()
    Store(data / "capture.db").close()
    (data / "runs" / "r1").mkdir(parents=True)
    (data / "runs" / "r1" / RESULTS).write_text(
        '{"rollout_id": "r1.g0r0", "task": "t", "group": 0, "index": 0, "ok": true}\n'
    )
    out = tmp_path / "out" / "rows.jsonl"
    target = plant(out, dangling=dangling)
    result = tapdeck("export", "r1", "--data-dir", str(data), "--out", str(out), data=data)
    assert result.returncode == 1
    assert one_line(result) == f"tapdeck export: {refusal(out)}"
    assert_untouched(target, dangling=dangling)


@pytest.mark.medium
def test_rollout_refuses_a_linked_server_log_before_starting_anything(tmp_path: Path) -> None:
    data = tmp_path / "data"
    target = plant(data / "rollout.log")
    result = tapdeck(
        "rollout", "--harness", "oracle", "--task", "hello-file", "--data-dir", str(data), data=data
    )
    assert result.returncode == 1
    assert one_line(result) == f"tapdeck rollout: {refusal(data / 'rollout.log')}"
    assert "starting a local tapdeck server" not in result.stderr
    assert_untouched(target)
