"""Training as a server job: `/admin/train` on a real tapdeck server (in this process, on a loopback
port) launching real recipe subprocesses; log, metrics and state over HTTP and SSE; stop; refusals."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tapdeck.runner.recipes import RECIPES, Recipe
from tapdeck.runner.training import death_reason, package_path
from tests.support.fake_vllm import models_only_engine
from tests.support.processes import process_gone
from tests.support.training_export import write_export


def events(server: Any, run_id: str, timeout_s: float = 120.0) -> list[dict]:
    """Every SSE event of one training run, until the server ends the stream."""
    out = []
    with server.http.stream("GET", f"/admin/train/{run_id}/events", timeout=timeout_s) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
    return out


def wait_for(check: Any, what: str, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return value


def test_recipes_route_says_what_the_servers_machine_can_start(
    train_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAPDECK_TRAIN_ENV", str(tmp_path / "no-train-env"))
    recipes = {r["name"]: r for r in train_server.http.get("/admin/train/recipes").json()["recipes"]}
    assert recipes["data-check"]["available"] and not recipes["data-check"]["updates_weights"]
    cpu = recipes["cpu-grpo"]
    assert cpu["updates_weights"] and cpu["env"] == "train" and not cpu["available"]
    assert "scripts/train-env.sh" in cpu["why"] and str(tmp_path / "no-train-env") in cpu["why"]


def test_a_recipe_of_a_missing_training_environment_is_refused_saying_how_to_make_it(
    train_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAPDECK_TRAIN_ENV", str(tmp_path / "no-train-env"))
    resp = train_server.http.post("/admin/train", json={"recipe": "cpu-grpo"})
    assert resp.status_code == 400 and "scripts/train-env.sh" in resp.json()["detail"]
    resp = train_server.http.post("/admin/train", json={"recipe": "no-such-recipe"})
    assert resp.status_code == 400 and "known: data-check" in resp.json()["detail"]
    assert train_server.http.get("/admin/train/t-nope").status_code == 404
    assert train_server.http.get("/admin/train").json() == {"runs": []}


@pytest.mark.medium
def test_data_check_job_streams_its_log_metrics_and_state_over_sse(train_server: Any, tmp_path: Path) -> None:
    rows = write_export(tmp_path / "rows.jsonl")
    resp = train_server.http.post(
        "/admin/train", json={"recipe": "data-check", "args": ["--rows", str(rows)]}
    )
    assert resp.status_code == 200, resp.text
    job = resp.json()
    assert job["state"] == "running" and job["argv"][-2:] == ["--rows", str(rows)]

    stream = events(train_server, job["id"])
    log = [line for e in stream if e["type"] == "log" for line in e["lines"]]
    assert "step 1: group 1" in "\n".join(log) and any("data-check: summary" in line for line in log)
    reward = [
        (p["step"], p["value"])
        for e in stream
        if e["type"] == "metrics"
        for p in e["points"]
        if p["name"] == "train/reward"
    ]
    assert reward == [(0, 0.5), (2, 0.5)]  # group 1 is unscorable: no reward logged for it
    states = [e["run"]["state"] for e in stream if e["type"] == "state"]
    assert states[-1] == "finished" and stream[-1]["type"] == "state"
    assert stream[-1]["run"]["exit_code"] == 0 and stream[-1]["run"]["error"] is None

    assert [r["id"] for r in train_server.http.get("/admin/train").json()["runs"]] == [job["id"]]
    tail = train_server.http.get(f"/admin/train/{job['id']}/log", params={"tail": 2}).json()
    assert tail["lines"] == log[-2:]
    again = train_server.http.get(f"/admin/train/{job['id']}/log", params={"offset": 0}).json()
    assert again["lines"] == log and again["offset"] == tail["offset"]
    metrics = train_server.http.get(f"/admin/train/{job['id']}/metrics").json()
    assert [(p["step"], p["value"]) for p in metrics["points"] if p["name"] == "train/reward"] == reward
    later = train_server.http.get(
        f"/admin/train/{job['id']}/metrics", params={"after": metrics["cursor"]}
    ).json()
    assert later == {"points": [], "cursor": metrics["cursor"]}


@pytest.mark.medium
def test_a_run_that_dies_says_why(train_server: Any, tmp_path: Path) -> None:
    garbled = tmp_path / "garbled.jsonl"
    garbled.write_text("not json\n")
    job = train_server.http.post(
        "/admin/train", json={"recipe": "data-check", "args": ["--rows", str(garbled)]}
    ).json()
    final = events(train_server, job["id"])[-1]["run"]
    assert final["state"] == "failed" and final["exit_code"] == 2
    assert f"{garbled}:1: not JSON" in final["error"] and final["error"].endswith("(exit code 2)")
    assert train_server.http.get(f"/admin/train/{job['id']}").json()["error"] == final["error"]


@pytest.mark.medium
def test_stop_over_http_ends_a_running_job_and_its_process_group(train_server: Any, tmp_path: Path) -> None:
    rows = write_export(tmp_path / "rows.jsonl")
    job = train_server.http.post(
        "/admin/train", json={"recipe": "data-check", "args": ["--rows", str(rows), "--step-delay", "60"]}
    ).json()
    url = f"/admin/train/{job['id']}"
    wait_for(lambda: train_server.http.get(f"{url}/metrics").json()["points"], "a first metric")
    stopped = train_server.http.post(f"{url}/stop").json()
    assert stopped["state"] == "stopped" and stopped["exit_code"] is not None
    assert process_gone(job["pid"])
    assert train_server.http.get(url).json()["state"] == "stopped"


def test_the_server_stops_its_running_jobs_when_it_shuts_down(tmp_path: Path) -> None:
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.config import ServerConfig

    rows = write_export(tmp_path / "rows.jsonl")
    with models_only_engine() as engine:  # settles at start; the recipe needs none
        local = LocalServer(ServerConfig(port=0, data_dir=tmp_path / "data", engine_url=engine)).start()
    try:
        job = httpx.post(
            f"{local.url}/admin/train",
            headers={"Authorization": f"Bearer {local.admin_key}"},
            json={"recipe": "data-check", "args": ["--rows", str(rows), "--step-delay", "60"]},
            timeout=60,
        ).json()
    finally:
        local.stop()
    record = json.loads((tmp_path / "data" / "train" / job["id"] / "run.json").read_text())
    assert record["state"] == "stopped"


def test_a_training_environment_recipe_imports_the_servers_tapdeck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe interpreter has no tapdeck installed; PYTHONPATH's package link gives it this one."""
    python311 = Path.home() / ".pyenv" / "versions"
    candidates = sorted(python311.glob("3.11*/bin/python3.11"))
    if not candidates:
        pytest.skip("needs another interpreter without tapdeck (pyenv 3.11)")
    env_dir = tmp_path / "train-env"
    (env_dir / "bin").mkdir(parents=True)
    (env_dir / "bin" / "python").symlink_to(candidates[0])
    src = tmp_path / "src"
    src.mkdir()
    (src / "where_recipe.py").write_text(
        "import tapdeck, sys; print(tapdeck.__file__); print(sys.version_info[:2])\n"
    )
    monkeypatch.setenv("TAPDECK_TRAIN_ENV", str(env_dir))
    monkeypatch.setenv("PYTHONPATH", str(src))
    monkeypatch.setitem(
        RECIPES,
        "where",
        Recipe(
            name="where", module="where_recipe", summary="t", where="t", updates_weights=False, env="train"
        ),
    )
    from tapdeck.runner.training import TrainingRun

    lines: list[str] = []
    job = TrainingRun("where", data_dir=tmp_path / "data", on_line=lines.append).start()
    assert job.wait(120) == 0, lines
    import tapdeck

    link = package_path(tmp_path / "data") / "tapdeck"
    assert Path(lines[0]).resolve() == Path(tapdeck.__file__).resolve()
    assert Path(lines[0]).parent == link and lines[1] == "(3, 11)"
    assert job.argv[0] == str(env_dir / "bin" / "python")
    assert "TAPDECK_ADMIN_KEY" not in job.record.env


def test_death_reason_is_the_last_exception_line_else_the_last_line() -> None:
    trace = [
        "Traceback (most recent call last):",
        '  File "x.py", line 1',
        "ValueError: bad row 3",
        "  during cleanup",
        "",
    ]
    assert death_reason(trace, 1) == "ValueError: bad row 3 (exit code 1)"
    assert (
        death_reason(["loading", "data-check: no rows at /x"], 2) == "data-check: no rows at /x (exit code 2)"
    )
    assert death_reason([], -9) == "no output (killed by signal SIGKILL)"
    assert death_reason([], -40) == "no output (killed by signal 40)"  # real-time: no name
    assert death_reason(["torch.OutOfMemoryError: CPU"], 1).startswith("torch.OutOfMemoryError")


@pytest.mark.medium
def test_admin_key_reaches_the_recipe_but_never_its_record(train_server: Any, tmp_path: Path) -> None:
    rows = write_export(tmp_path / "rows.jsonl")
    job = train_server.http.post(
        "/admin/train", json={"recipe": "data-check", "args": ["--rows", str(rows)]}
    ).json()
    events(train_server, job["id"])
    record = json.loads((Path(job["run_dir"]) / "run.json").read_text())
    assert record["env"]["TAPDECK_SERVER_URL"] == train_server.url
    assert "TAPDECK_ADMIN_KEY" not in record["env"] and train_server.admin_key not in json.dumps(record)
    assert os.environ.get("TAPDECK_ADMIN_KEY") != train_server.admin_key
    assert sys.executable == record["argv"][0]
