"""The path from a run to training, at its edges: what `tapdeck export` writes for a run (rewards,
Parquet types), what `tapdeck train` and the server refuse, what data-check does with nothing to
check, and where a recipe's trackio metrics are read from.

The store is a real SQLite capture store holding turns built from recorded vLLM bodies; recipes run
as real subprocesses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tapdeck.app.client import DETAIL_LIMIT
from tapdeck.proxy.capture.export import write_jsonl
from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.store.database import Store
from tapdeck.runner.recipes import RECIPES
from tapdeck.runner.train_env import SCRIPT
from tapdeck.runner.train_jobs import read_metrics
from tapdeck.runner.training import TrainEnvMissing, TrainingRun, load_run, recipe_python
from tests.support.recorded_turns import turn_from_fixture
from tests.support.training_export import rollout_rows, write_export


def _data_dir_with_run(
    tmp_path: Path, results: list[dict[str, Any]], session_reward: float | None = 0.0, tier: str = "tokens"
) -> Path:
    """A data dir whose store holds one captured session per result (two recorded turns each,
    its metadata's reward `session_reward`, captured at `tier`: below `tokens` an eval rollout),
    and run `run-x` with those results."""
    data = tmp_path / "data"
    run = data / "runs" / "run-x"
    run.mkdir(parents=True)
    store = Store(data / "capture.db")
    try:
        for result in results:
            sid = result["session_id"]
            store.create_session(
                {
                    "id": sid,
                    "tier": tier,
                    "rollout_type": "train" if tier == "tokens" else "eval",
                    "metadata": {"reward": session_reward},
                }
            )
            graph = RolloutGraph()
            for seq, name in enumerate(["chat_multiturn_1", "chat_multiturn_2"]):
                turn = turn_from_fixture(name, seq, sid)
                store.append_turn(turn, graph.add(turn))
    finally:
        store.close()
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    return data


def _result(index: int, **fields: Any) -> dict[str, Any]:
    return {
        "rollout_id": f"run-x.g000r{index:02d}",
        "run_id": "run-x",
        "task": "t",
        "group": 0,
        "index": index,
        "session_id": f"s-{index}",
        "reward": 0.0,
        "ok": True,
    } | fields


def _export(data: Path, *args: str) -> Any:
    from tapdeck.app.cli import app

    return CliRunner().invoke(app, ["export", *args, "--data-dir", str(data)])


def test_run_export_keeps_a_never_graded_result_null_even_when_its_session_holds_a_reward(
    tmp_path: Path,
) -> None:
    data = _data_dir_with_run(tmp_path, [_result(0, reward=None), _result(1, reward=1.0)], session_reward=0.0)
    out = tmp_path / "rows.jsonl"
    res = _export(data, "run-x", "--out", str(out))
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # The run's result is the reward rule's verdict: null (never graded) is never the session's 0.
    assert {r["rollout_id"]: r["reward"] for r in rows} == {"run-x.g000r00": None, "run-x.g000r01": 1.0}
    # A session exported on its own still carries the reward annotated on it.
    res = _export(data, "s-0", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert {json.loads(line)["reward"] for line in out.read_text().splitlines()} == {0.0}


def test_a_servers_run_export_keeps_the_results_reward_and_error_kind_over_the_sessions(
    tmp_path: Path,
) -> None:
    # What `tapdeck train --run` reads: the server's export, not the CLI's.
    from types import SimpleNamespace

    import httpx

    from tests.support.fake_vllm import models_only_engine
    from tests.support.local_server import local_server_on

    data = _data_dir_with_run(
        tmp_path, [_result(0, reward=None), _result(1, ok=False, error_kind="timeout")], session_reward=0.0
    )
    (data / "runs" / "run-x" / "plan.json").write_text(
        json.dumps(
            {"id": "run-x", "created_at": 1.0, "plan": {"k": 2}, "tasks": [{"name": "t", "path": "/t"}]}
        )
    )
    with models_only_engine() as url:
        engine = SimpleNamespace(base_url=f"{url}/v1", served_name="smollm2")
        with local_server_on(engine, data) as server:
            resp = httpx.post(
                f"{server.url}/admin/runs/run-x/export",
                json={"format": "jsonl"},
                headers={"Authorization": f"Bearer {server.admin_key}"},
                timeout=60,
            )
    assert resp.status_code == 200, resp.text
    rows = [json.loads(line) for line in Path(resp.json()["path"]).read_text().splitlines()]
    assert {(r["rollout_id"], r["reward"], r["error_kind"]) for r in rows} == {
        ("run-x.g000r00", None, None),
        ("run-x.g000r01", 0.0, "timeout"),
    }


def test_parquet_exports_of_an_all_ok_run_and_a_failed_one_read_as_one_dataset(tmp_path: Path) -> None:
    data = _data_dir_with_run(tmp_path, [_result(0), _result(1, ok=False, error_kind="cancelled")])
    files = tmp_path / "files"
    ok_only = files / "a-ok.parquet"  # read first: its schema is the dataset's
    assert _export(data, "run-x", "--out", str(ok_only)).exit_code == 0
    assert _export(data, "run-x", "--include-failed", "--out", str(files / "b-all.parquet")).exit_code == 0
    # No rollout of the first file failed, and its error_kind is still a string column.
    assert pq.read_schema(ok_only).field("error_kind").type == "string"
    table = ds.dataset(files).to_table()  # a null-typed column there made this raise
    assert table.schema.field("error_kind").type == "string"
    assert sorted(table.column("error_kind").to_pylist(), key=str) == [None] * 4 + ["cancelled"] * 2
    assert table.schema.field("group_id").type == "string" and table.schema.field("ok").type == "bool"


def _check(tmp_path: Path, rows: list[dict[str, Any]]) -> tuple[TrainingRun, list[str]]:
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    lines: list[str] = []
    job = TrainingRun(
        "data-check", ["--rows", str(path)], data_dir=tmp_path / "data", on_line=lines.append
    ).start()
    job.wait()
    return job, lines


def test_data_check_with_no_rollout_fails_saying_there_is_nothing_to_check(tmp_path: Path) -> None:
    job, lines = _check(tmp_path, [])
    record = load_run(tmp_path / "data", job.run_id)
    assert (record.state, record.exit_code) == ("failed", 2), lines
    assert "nothing to check" in record.error and "holds no rollout" in record.error
    assert not any(job.trackio_dir.iterdir())  # nothing was logged as if it had been checked


def test_data_check_with_only_failed_rollouts_fails_saying_they_were_left_out(tmp_path: Path) -> None:
    rows = [dict(r, ok=False, error_kind="agent_timeout") for r in rollout_rows("ro-a")]
    job, lines = _check(tmp_path, rows)
    record = load_run(tmp_path / "data", job.run_id)
    assert (record.state, record.exit_code) == ("failed", 2), lines
    assert "every rollout in it was left out for not ending ok" in record.error
    assert any("left out 1 rollout(s) that did not end ok" in line for line in lines)


def test_metrics_of_a_recipe_that_renamed_its_trackio_run_and_project_still_reach_the_api(
    tmp_path: Path,
) -> None:
    rows = write_export(tmp_path / "rows.jsonl")
    job = TrainingRun(
        "data-check",
        ["--rows", str(rows), "--name", "mine", "--project", "other"],
        data_dir=tmp_path / "data",
    ).start()
    assert job.wait() == 0
    points = read_metrics(load_run(tmp_path / "data", job.run_id), 0).points
    assert {p.step for p in points if p.name == "train/reward"} == {0, 2}
    assert read_metrics(load_run(tmp_path / "data", job.run_id), 0).cursor > 0


def _train(*args: str) -> Any:
    from tapdeck.app.cli import app

    return CliRunner().invoke(app, ["train", *args])


@pytest.mark.parametrize("run", ["../run-x", "runs/run-x", ".."])
def test_train_refuses_a_run_id_that_is_a_path_as_bad_usage(run: str, tmp_path: Path) -> None:
    res = _train("--run", run, "--data-dir", str(tmp_path / "data"))
    assert res.exit_code == 2, res.output
    assert f"--run {run!r} is not a run id" in res.output
    assert not (tmp_path / "data").exists()  # refused before a server started there


def test_train_refuses_a_run_for_a_recipe_that_takes_none(train_server: Any, tmp_path: Path) -> None:
    res = _train("--recipe", "cpu-grpo", "--run", "run-x", "--data-dir", str(tmp_path / "cli"))
    assert res.exit_code == 2, res.output
    assert "cpu-grpo takes no rollout run (--run run-x)" in res.output
    assert "tapdeck train --recipe cpu-grpo -- --help" in res.output
    assert not (tmp_path / "cli").exists()  # refused before a server started there
    # The server refuses it too, whatever its training environment, and starts no job.
    resp = train_server.http.post("/admin/train", json={"recipe": "cpu-grpo", "run": "run-x"})
    assert resp.status_code == 400 and "cpu-grpo takes no rollout run" in resp.json()["detail"]
    assert train_server.http.get("/admin/train").json() == {"runs": []}
    # grpo-trl reads --run itself and data-check reads the run's rows: neither is refused so.
    assert RECIPES["grpo-trl"].run_refused("run-x") is None
    assert RECIPES["data-check"].run_refused("run-x") is None


def test_a_missing_training_environment_names_the_whole_command_that_makes_it_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = tmp_path / "elsewhere"
    monkeypatch.setenv("TAPDECK_TRAIN_ENV", str(env))
    with pytest.raises(TrainEnvMissing) as caught:
        recipe_python(RECIPES["cpu-grpo"])
    why = str(caught.value)
    # Runnable from any directory, and it makes the environment where the server looks for it.
    assert f"TAPDECK_TRAIN_ENV={env} bash {SCRIPT}" in why and SCRIPT.is_absolute()
    assert len(why) <= DETAIL_LIMIT  # where the API client cuts an error's detail


@pytest.mark.medium
def test_train_summary_shows_how_often_a_rollout_forked(train_server: Any, tmp_path: Path) -> None:
    rows = write_export(tmp_path / "rows.jsonl")
    res = _train("--server", train_server.url, "--admin-key", train_server.admin_key, "--rows", str(rows))
    assert res.exit_code == 0, res.output
    # Group 2's re-tokenised pair forks: a fragmented rollout is visible without opening trackio.
    assert "  train/rollout/fork_frac = 1 (step 2)" in res.output


def _write_plan(data: Path, *, rollouts: int, state: str) -> Path:
    """Give run-x a plan of one task × `rollouts` and a recorded state; its folder."""
    run = data / "runs" / "run-x"
    (run / "plan.json").write_text(
        json.dumps(
            {
                "id": "run-x",
                "created_at": 1.0,
                "plan": {"k": rollouts},
                "tasks": [{"name": "t", "path": "/t"}],
            }
        )
    )
    (run / "run.json").write_text(json.dumps({"state": state, "created_at": 1.0}))
    return run


def _train_on_a_server_of(data: Path, *args: str) -> Any:
    """`tapdeck train --server` against a real server on `data` (a models-only default engine)."""
    from types import SimpleNamespace

    from tests.support.fake_vllm import models_only_engine
    from tests.support.local_server import local_server_on

    with models_only_engine() as url:
        engine = SimpleNamespace(base_url=f"{url}/v1", served_name="smollm2")
        with local_server_on(engine, data) as server:
            return _train("--server", server.url, "--admin-key", server.admin_key, *args)


@pytest.mark.medium
def test_train_on_a_run_still_going_warns_that_it_reads_what_is_done_so_far(tmp_path: Path) -> None:
    from tests.support.run_lock_holder import holding_run_lock

    data = _data_dir_with_run(tmp_path, [_result(0)])
    run = _write_plan(data, rollouts=2, state="running")
    with holding_run_lock(run):  # another process runs it: one of its two rollouts has finished
        res = _train_on_a_server_of(data, "--run", "run-x")
    # Allowed, as on the Train screen (a first look at a long batch), but never silently partial.
    assert res.exit_code == 0, res.output
    assert (
        "tapdeck train: run run-x is still going: data-check reads the 1 of 2 rollouts done so far"
    ) in res.output
    assert "data-check: 1 rollout(s) from" in res.output


def test_train_refuses_recipe_args_that_name_the_runs_rows_or_run_again_before_a_job_starts(
    tmp_path: Path,
) -> None:
    from types import SimpleNamespace

    from tests.support.fake_vllm import models_only_engine
    from tests.support.local_server import local_server_on

    data = _data_dir_with_run(tmp_path, [_result(0), _result(1)])
    _write_plan(data, rollouts=2, state="finished")
    rows = write_export(tmp_path / "rows.jsonl")
    refused = "tapdeck train: POST /admin/train refused (422): data-check: "
    with models_only_engine() as url:
        engine = SimpleNamespace(base_url=f"{url}/v1", served_name="smollm2")
        with local_server_on(engine, data) as server:

            def train(*args: str) -> Any:
                return _train("--server", server.url, "--admin-key", server.admin_key, *args)

            # The job's parser kept the last --rows: the file silently replaced the run's rows.
            both_rows = train("--run", "run-x", "--", "--rows", str(rows))
            # data-check's own --run after the launch's: its parser refused --rows it never saw.
            both_runs = train("--run", "run-x", "--", "--run", "run-y")
            # Its own --run alone reads only an export already written (run-x has none yet).
            own_run = train("--", "--run", "run-x")
    for res in (both_rows, both_runs, own_run):
        assert res.exit_code == 2, res.output
    assert both_rows.output.strip() == (
        f"{refused}--run run-x and --rows {rows} both name the rows to read: give one (--run: the "
        "server exports that run's rows; --rows: an export file on the server's machine)"
    )
    assert both_runs.output.strip() == (
        f"{refused}--run run-x and its own --run run-y both name the run: give it once, as --run "
        "before -- (the server exports its rows)"
    )
    assert own_run.output.strip() == (
        f"{refused}give the run as --run run-x before -- (the Train screen: pick it), not as "
        "data-check's own --run, which reads only an export already written"
    )
    assert not (data / "train").is_dir() or not any((data / "train").glob("t-*"))
    # grpo-trl, which is given the launch's run as its own --run, is refused so too.
    assert RECIPES["grpo-trl"].usage_error(["--run", "run-y"], run="run-x") == (
        "grpo-trl: --run run-x and its own --run run-y both name the run: give it once"
    )
    assert RECIPES["grpo-trl"].usage_error([], run="run-x") is None
    assert RECIPES["data-check"].usage_error(["--rows", str(rows)]) is None
    assert RECIPES["data-check"].usage_error(["--step-delay", "0"], run="run-x") is None


def test_train_refuses_a_run_whose_rollouts_are_all_eval_tier_saying_so(tmp_path: Path) -> None:
    data = _data_dir_with_run(tmp_path, [_result(0), _result(1)], tier="logprobs")
    _write_plan(data, rollouts=2, state="finished")
    res = _train_on_a_server_of(data, "--run", "run-x")
    assert res.exit_code == 1, res.output
    assert (
        "run run-x has nothing to train on: none of its 2 finished rollout(s) gave a "
        "training row (run-x.g000r00: session s-0 is an eval rollout"
    ) in res.output
    assert "training run t-" not in res.output


def test_train_given_a_recipe_name_without_recipe_says_to_use_the_option(tmp_path: Path) -> None:
    res = _train("cpu-grpo", "--steps", "1", "--data-dir", str(tmp_path / "data"))
    assert res.exit_code == 2, res.output
    # Not data-check's complaint about rows: the name was meant as the recipe.
    assert (
        res.output.strip()
        == "tapdeck train: give the recipe as an option: tapdeck train --recipe cpu-grpo ..."
    )
    assert not (tmp_path / "data").exists()  # refused before a server started there


@pytest.mark.parametrize("damage", ["plan", "session"])
def test_train_on_a_run_that_cannot_be_read_says_why_in_one_line(damage: str, tmp_path: Path) -> None:
    data = _data_dir_with_run(tmp_path, [_result(0)])
    run = _write_plan(data, rollouts=2, state="finished")
    if damage == "plan":
        (run / "plan.json").write_text("{not json")
    else:  # a rollout whose session the store does not have
        with (run / "results.jsonl").open("a") as results:
            results.write(json.dumps(_result(1, session_id="s-gone")) + "\n")
    res = _train_on_a_server_of(data, "--run", "run-x")
    assert res.exit_code == 1, res.output
    (line,) = res.output.strip().splitlines()  # not the server's 500
    why = "run-x/plan.json is not a readable plan" if damage == "plan" else "names session s-gone"
    assert (
        line.startswith("tapdeck train: POST /admin/train refused (400): cannot train on run run-x: ")
        and why in line
    ), line


@pytest.mark.medium
def test_train_names_the_rollouts_of_a_run_that_gave_no_training_row_in_its_log(tmp_path: Path) -> None:
    data = _data_dir_with_run(tmp_path, [_result(0), _result(1)])
    run = _write_plan(data, rollouts=3, state="finished")
    store = Store(data / "capture.db")  # a third rollout, captured below the tokens tier
    try:
        store.create_session(
            {"id": "s-eval", "tier": "logprobs", "rollout_type": "eval", "metadata": {"reward": 0.0}}
        )
        graph = RolloutGraph()
        turn = turn_from_fixture("chat_multiturn_1", 0, "s-eval")
        store.append_turn(turn, graph.add(turn))
    finally:
        store.close()
    with (run / "results.jsonl").open("a") as results:
        results.write(json.dumps(_result(2, session_id="s-eval")) + "\n")
    res = _train_on_a_server_of(data, "--run", "run-x")
    assert res.exit_code == 0, res.output
    # As `tapdeck export` counts them: a check of 2 rollouts must not pass for the run's 3.
    assert (
        "[tapdeck] left out 1 finished rollout(s) of run run-x that gave no training row: "
        "run-x.g000r02: session s-eval is an eval rollout"
    ) in res.output
    assert "data-check: 2 rollout(s) from" in res.output
