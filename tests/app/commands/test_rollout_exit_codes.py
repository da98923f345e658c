"""`tapdeck rollout`'s exit codes, as `--help` and the README state them: 0 every rollout ok, 1 the
run could not be run, 2 bad usage (an unknown option or a plan the server refused), 3 the run ended
with some rollout not ok."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.app.commands.run_follow import _engine_failure
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_OK, EXIT_ROLLOUT_FAILED, EXIT_USAGE
from tapdeck.schema.runs import RolloutResult, RunDetail, RunPlan
from tests.support.fake_vllm import models_only_engine
from tests.support.local_server import local_server_on
from tests.support.runner_server import make_task


def test_rollout_help_states_every_exit_code() -> None:
    result = CliRunner().invoke(app, ["rollout", "--help"], env={"COLUMNS": "100", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for needle in (
        "Exit codes: 0 every rollout ok",
        "1 the run could not be run",
        "2 bad usage",
        "3 the run ended with some rollout not ok",
    ):
        assert needle in text, needle


def test_an_unknown_option_exits_2() -> None:
    assert CliRunner().invoke(app, ["rollout", "--no-such-flag"]).exit_code == EXIT_USAGE


def test_no_engine_answering_exits_1(tmp_path: Path, dead_engine_url: str) -> None:
    result = CliRunner().invoke(
        app, ["rollout", "--engine", dead_engine_url, "--engine-wait", "0.5", "--data-dir", str(tmp_path)]
    )
    assert result.exit_code == EXIT_COULD_NOT_RUN, result.output
    [line] = [ln for ln in result.output.splitlines() if ln.startswith("tapdeck rollout:")]
    assert f"tried GET {dead_engine_url}/models" in line and line.endswith(" s; --engine-wait)")


def test_a_plan_the_server_refuses_exits_2(tmp_path: Path) -> None:
    with models_only_engine() as engine:
        result = CliRunner().invoke(
            app, ["rollout", "--engine", engine, "--harness", "no-such-harness", "--data-dir", str(tmp_path)]
        )
    assert result.exit_code == EXIT_USAGE, result.output
    assert "no-such-harness" in result.output


@pytest.mark.slow
def test_a_failed_rollout_exits_3_and_the_table_says_why(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks", "no-reward", "echo 'this verifier writes no reward'\n")
    result = CliRunner().invoke(
        app,
        [
            "rollout",
            "--dataset",
            str(task),
            "--harness",
            "oracle",
            "--timeout",
            "120",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        env={"COLUMNS": "100"},
    )
    assert result.exit_code == EXIT_ROLLOUT_FAILED, result.output
    assert "(no engine: oracle calls no model)" in result.output
    assert "verifier_failed" in result.output and "0 ok, 1 failed" in result.output
    assert "\nno-reward: RewardFileNotFoundError during verify: No reward file found" in result.output


@pytest.fixture(scope="module")
def models_only_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A tapdeck server in this process whose default engine lists models and answers no call."""
    with models_only_engine() as url:
        engine = SimpleNamespace(base_url=f"{url}/v1", served_name="smollm2")
        with local_server_on(engine, tmp_path_factory.mktemp("server")) as server:
            yield server


def _remote(server: Any, *args: str) -> Any:
    return CliRunner().invoke(
        app, ["rollout", "--server", server.url, "--admin-key", server.admin_key, *args]
    )


@pytest.mark.parametrize("option", ["--timeout", "--agent-timeout", "--temperature", "--top-p"])
@pytest.mark.parametrize("value", ["inf", "nan"])
def test_a_number_that_is_not_finite_exits_2(option: str, value: str) -> None:
    result = CliRunner().invoke(app, ["rollout", option, value])
    assert result.exit_code == EXIT_USAGE, result.output
    assert "must be a finite number" in result.output and "Traceback" not in result.output


def test_an_unknown_sandbox_exits_2_before_a_run_is_created(models_only_server: Any) -> None:
    runs = Path(models_only_server.config.data_dir) / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    result = _remote(models_only_server, "--sandbox", "bogus", "--harness", "oracle")
    assert result.exit_code == EXIT_USAGE, result.output
    assert "unknown sandbox 'bogus'" in result.output
    assert (set(runs.iterdir()) if runs.is_dir() else set()) == before


def test_resuming_a_run_that_does_not_exist_exits_1(tmp_path: Path, models_only_server: Any) -> None:
    local = CliRunner().invoke(app, ["rollout", "--resume", "nosuch", "--data-dir", str(tmp_path)])
    assert local.exit_code == EXIT_COULD_NOT_RUN, local.output
    assert f"no run nosuch in {tmp_path / 'runs'}" in " ".join(local.output.split())
    remote = _remote(models_only_server, "--resume", "nosuch")
    assert remote.exit_code == EXIT_COULD_NOT_RUN, remote.output
    assert f"no run nosuch on the server at {models_only_server.url}" in remote.output


def test_resuming_a_run_whose_plan_file_is_corrupt_exits_1_naming_the_file(
    tmp_path: Path, models_only_server: Any, dead_engine_url: str
) -> None:
    # Locally it is refused before a server starts (a dead engine: no engine is needed to say so).
    plan = tmp_path / "runs" / "run-x" / "plan.json"
    plan.parent.mkdir(parents=True)
    plan.write_text("{not json")
    why = f"{plan} is not a readable plan (JSONDecodeError: Expecting property name"
    local = CliRunner().invoke(
        app, ["rollout", "--resume", "run-x", "--data-dir", str(tmp_path), "--engine", dead_engine_url]
    )
    assert local.exit_code == EXIT_COULD_NOT_RUN, local.output
    [line] = local.output.strip().splitlines()
    assert line.startswith(f"tapdeck rollout: cannot resume run run-x: {why}")
    served = Path(models_only_server.config.data_dir) / "runs" / "run-corrupt" / "plan.json"
    served.parent.mkdir(parents=True)
    served.write_text("")
    remote = _remote(models_only_server, "--resume", "run-corrupt")
    assert remote.exit_code == EXIT_COULD_NOT_RUN, remote.output
    [line] = remote.output.strip().splitlines()
    assert line == (
        f"tapdeck rollout: POST /admin/runs/run-corrupt/resume refused (409): cannot "
        f"resume run run-corrupt: {served} is not a readable plan (JSONDecodeError: "
        "Expecting value: line 1 column 1 (char 0))"
    )
    # Nor does it break the list of runs.
    listed = httpx.get(
        f"{models_only_server.url}/admin/runs",
        headers={"Authorization": f"Bearer {models_only_server.admin_key}"},
    )
    assert listed.status_code == 200
    assert "run-corrupt" not in {r["id"] for r in listed.json()["runs"]}


@pytest.mark.parametrize("run_id", ["", ".", "..", "../runs/run-x"])
def test_resume_refuses_a_run_id_that_is_not_a_plain_name(run_id: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["rollout", "--resume", run_id, "--data-dir", str(tmp_path)])
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.output.strip() == (
        f"tapdeck rollout: --resume {run_id!r} is not a run id: give "
        "the id a run was started with (run-…), not a path"
    )


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["-k", "1025"], "k: Input should be less than or equal to 1024"),
        (["-k", "1000000000000"], "k: Input should be less than or equal to 1024"),
        (["-c", "1025"], "concurrency: Input should be less than or equal to 1024"),
        (["-n", "100001"], "n_tasks: Input should be less than or equal to 100000"),
    ],
)
def test_a_size_past_its_bound_exits_2_naming_the_field(
    args: list[str], field: str, tmp_path: Path, dead_engine_url: str
) -> None:
    # A dead engine: were the size not refused first, no engine would start either.
    result = CliRunner().invoke(
        app,
        ["rollout", *args, "--engine", dead_engine_url, "--engine-wait", "0", "--data-dir", str(tmp_path)],
    )
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.output.strip() == f"tapdeck rollout: plan refused: {field}"


def test_resume_refuses_plan_options_naming_them() -> None:
    result = CliRunner().invoke(app, ["rollout", "--resume", "run-x", "-k", "5", "--harness", "oracle"])
    assert result.exit_code == EXIT_USAGE, result.output
    text = " ".join(result.output.split())
    assert "--harness, -k/--rollouts would be ignored" in text


def test_resume_of_a_run_that_calls_no_model_refuses_engine_options_naming_them(
    tmp_path: Path, dead_engine_url: str
) -> None:
    import asyncio

    from tapdeck.runner.batch import BatchRunner
    from tapdeck.schema.runs import RolloutTemplate

    # An oracle run whose process died before its rollout ran: its local server starts no engine.
    plan = RunPlan(tasks=["hello-file"], rollout=RolloutTemplate(harness="oracle", timeout_s=120))
    run = asyncio.run(BatchRunner(None, data_dir=tmp_path, default_engine=None).create(plan))
    result = CliRunner().invoke(
        app,
        [
            "rollout",
            "--resume",
            run.id,
            "--data-dir",
            str(tmp_path),
            "--engine",
            dead_engine_url,
            "--engine-model",
            "m",
        ],
    )
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.output.strip() == (
        f"tapdeck rollout: --resume runs run {run.id}'s stored plan, whose harness oracle calls no "
        "model, so --engine, --engine-model would be ignored; drop them"
    )
    [again] = BatchRunner(None, data_dir=tmp_path, default_engine=None).list()
    assert again.counts.done == 0  # nothing was run


def test_a_dead_engine_behind_a_server_exits_1_as_a_local_one_does(
    models_only_server: Any, dead_engine_url: str
) -> None:
    result = _remote(models_only_server, "--engine", dead_engine_url, "--timeout", "120")
    assert result.exit_code == EXIT_COULD_NOT_RUN, result.output
    assert "no rollout reached the engine" in result.output
    assert f"tried GET {dead_engine_url}/models" in " ".join(result.output.split())


def test_server_given_as_host_port_is_accepted_and_a_short_dataset_is_said(
    tmp_path: Path, models_only_server: Any
) -> None:
    make_task(tmp_path / "tasks", "only-task", "echo 1 > /logs/verifier/reward.txt\n")
    result = CliRunner().invoke(
        app,
        [
            "rollout",
            "--server",
            models_only_server.url.removeprefix("http://"),
            "--admin-key",
            models_only_server.admin_key,
            "--dataset",
            str(tmp_path / "tasks"),
            "-n",
            "3",
            "--harness",
            "oracle",
            "--timeout",
            "120",
        ],
    )
    assert result.exit_code == EXIT_OK, result.output
    assert "the dataset has 1 task: running 1, not the 3 asked (-n)" in result.output


def test_no_admin_key_found_says_where_it_looked(
    tmp_path: Path, models_only_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TAPDECK_ADMIN_KEY", raising=False)
    result = CliRunner().invoke(
        app, ["rollout", "--server", models_only_server.url, "--data-dir", str(tmp_path / "nonexistent")]
    )
    assert result.exit_code == EXIT_COULD_NOT_RUN, result.output
    text = " ".join(result.output.split())
    assert (
        f"no admin key found (looked at --admin-key, $TAPDECK_ADMIN_KEY and "
        f"{tmp_path / 'nonexistent' / 'admin.key'}); pass the server's key with --admin-key"
    ) in text
    assert "401" not in text


def test_a_rejected_admin_key_names_where_that_key_came_from(
    tmp_path: Path, models_only_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TAPDECK_ADMIN_KEY", raising=False)
    result = CliRunner().invoke(
        app,
        [
            "rollout",
            "--server",
            models_only_server.url,
            "--data-dir",
            str(tmp_path / "empty"),
            "--admin-key",
            "not-the-key",
        ],
    )
    assert result.exit_code == EXIT_COULD_NOT_RUN, result.output
    text = " ".join(result.output.split())
    assert "the server rejected the admin key from --admin-key or $TAPDECK_ADMIN_KEY (401)" in text
    assert str(tmp_path) not in text  # the data dir's admin.key was not what was sent
    assert "run run-" not in text  # refused before any run exists
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "admin.key").write_text("not-the-key\n")
    result = CliRunner().invoke(
        app, ["rollout", "--server", models_only_server.url, "--data-dir", str(tmp_path / "data")]
    )
    assert result.exit_code == EXIT_COULD_NOT_RUN, result.output
    assert (
        f"the server rejected the admin key read from {tmp_path / 'data' / 'admin.key'}; pass the "
        "server's key with --admin-key"
    ) in " ".join(result.output.split())


def _ended_run(*error_kinds: str | None) -> RunDetail:
    rollouts = [
        RolloutResult(
            rollout_id=f"run-1-0-{i}",
            run_id="run-1",
            task="hello-file",
            index=i,
            ok=kind is None,
            error_kind=kind,
            error="engine http://127.0.0.1:9/v1 is unreachable" if kind else None,
        )
        for i, kind in enumerate(error_kinds)
    ]
    return RunDetail(id="run-1", state="finished", plan=RunPlan(), created_at=0.0, rollouts=rollouts)


RESUME = "tapdeck rollout --resume run-1 --data-dir d"
GONE = "the embedded engine served by pid 7 at http://127.0.0.1:9/v1 went away mid-run (it exited)"


def test_a_run_whose_rollouts_saw_the_reused_engine_go_first_names_it_and_the_resume() -> None:
    why = _engine_failure(_ended_run("engine_unreachable", None, "engine_unreachable"), RESUME, lambda: GONE)
    assert why == (
        f"{GONE}: 2 rollout(s) ended engine_unreachable; `{RESUME}` runs them again "
        "(on an engine that answers)"
    )


def test_failed_rollouts_on_a_reused_engine_that_still_answers_are_rollout_failures() -> None:
    assert _engine_failure(_ended_run("engine_unreachable", None), RESUME, lambda: None) is None
    asked: list[bool] = []
    # Nothing ended engine_unreachable: the engine is not even asked.
    assert _engine_failure(_ended_run("verifier_failed"), RESUME, lambda: asked.append(True) or GONE) is None
    assert not asked


def test_a_run_no_rollout_of_which_reached_the_engine_gives_the_resume() -> None:
    why = _engine_failure(_ended_run("engine_unreachable", "engine_unreachable"), RESUME, None)
    assert why == (
        "no rollout reached the engine: engine http://127.0.0.1:9/v1 is unreachable; "
        f"`{RESUME}` runs them again (on an engine that answers)"
    )
