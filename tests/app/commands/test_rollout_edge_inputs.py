"""`tapdeck rollout` given inputs at their edges: options that conflict, a run to resume that has
nothing left to run, a dataset name its registry does not know or a registry that does not answer,
a dataset folder holding a task Harbor cannot read. Each is said in one line, with README's exit
code (0 ok, 1 could not do the work, 2 bad usage)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_OK, EXIT_USAGE
from tapdeck.runner.datasets import SAMPLE_DATASET_DIR
from tests.support.fake_vllm import models_only_engine
from tests.support.harbor_registry import (
    REGISTRY_URL_VAR,
    registry_knowing_no_dataset,
    registry_never_answering,
)
from tests.support.local_server import local_server_on
from tests.support.ports import free_port


def _rollout(*args: str, registry: str, tmp: Path) -> subprocess.CompletedProcess:
    """`tapdeck rollout ARGS` in a process of its own whose Harbor looks datasets up at `registry`."""
    env = os.environ | {REGISTRY_URL_VAR: registry, "COLUMNS": "400"}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from tapdeck.app.cli import main; main()",
            "rollout",
            *args,
            "--data-dir",
            str(tmp / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def _last_line(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "tasks", [["hello-file"], ["hello-file", "json-config"]], ids=["one task", "two tasks"]
)
def test_rollout_refuses_n_with_a_single_task_or_several(
    tasks: list[str], tmp_path: Path, dead_engine_url: str
) -> None:
    # A dead engine: were the conflict not refused first, no engine would start either.
    named = [arg for name in tasks for arg in ("--task", name)]
    result = CliRunner().invoke(
        app,
        ["rollout", *named, "-n", "3", "--engine", dead_engine_url, "--engine-wait", "0"]
        + ["--data-dir", str(tmp_path)],
    )
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.output.strip() == (
        "tapdeck rollout: -n/--tasks picks the dataset's first N tasks, so with --task, which "
        "names them, it would be ignored; drop one of them"
    )
    assert not (tmp_path / "runs").exists()


def _files(run_dir: Path) -> dict[Path, bytes]:
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture
def complete_run(tmp_path: Path) -> Iterator[SimpleNamespace]:
    """A run of one oracle rollout that ran to its end, in `.data`, with the engine it ran on."""
    data = tmp_path / "data"
    with models_only_engine() as engine:
        ran = CliRunner().invoke(
            app,
            [
                "rollout",
                "--harness",
                "oracle",
                "--task",
                "hello-file",
                "--timeout",
                "120",
                "--engine",
                engine,
                "--data-dir",
                str(data),
            ],
        )
        assert ran.exit_code == EXIT_OK, ran.output
        [run_dir] = (data / "runs").iterdir()
        yield SimpleNamespace(
            data=data,
            engine=engine,
            dir=run_dir,
            id=run_dir.name,
            said=f"run {run_dir.name} is already complete: 1 rollout, 1 ok, 0 "
            f"failed; nothing to resume (results: {run_dir})",
        )


@pytest.mark.slow
def test_resuming_a_complete_run_says_so_and_starts_nothing(
    complete_run: SimpleNamespace, dead_engine_url: str
) -> None:
    before = _files(complete_run.dir)
    # No server and no engine start (this one is dead: starting it would fail the command).
    result = CliRunner().invoke(
        app,
        [
            "rollout",
            "--resume",
            complete_run.id,
            "--data-dir",
            str(complete_run.data),
            "--engine",
            dead_engine_url,
        ],
    )
    assert result.exit_code == EXIT_OK, result.output
    assert result.output.strip() == complete_run.said
    assert _files(complete_run.dir) == before


@pytest.mark.slow
def test_resuming_a_complete_run_on_a_server_says_so_and_leaves_it_untouched(
    complete_run: SimpleNamespace,
) -> None:
    before = _files(complete_run.dir)
    engine = SimpleNamespace(base_url=f"{complete_run.engine}/v1", served_name="smollm2")
    with local_server_on(engine, complete_run.data) as server:
        result = CliRunner().invoke(
            app,
            ["rollout", "--server", server.url, "--admin-key", server.admin_key, "--resume", complete_run.id],
        )
    assert result.exit_code == EXIT_OK, result.output
    assert result.output.strip() == complete_run.said
    assert _files(complete_run.dir) == before  # its results, state and trials as the run left them


@pytest.mark.medium
def test_rollout_says_a_dataset_name_its_registry_does_not_know_is_unknown(tmp_path: Path) -> None:
    with registry_knowing_no_dataset() as registry, models_only_engine() as engine:
        result = _rollout(
            "--dataset",
            "no-such-dataset",
            "--harness",
            "oracle",
            "--engine",
            engine,
            registry=registry,
            tmp=tmp_path,
        )
    assert result.returncode == EXIT_USAGE, result.stderr
    assert _last_line(result) == (
        "tapdeck rollout: POST /admin/runs refused (400): unknown dataset 'no-such-dataset': no "
        "folder of that name here, and the Harbor registry does not know it (Dataset "
        "no-such-dataset not found)"
    )


@pytest.mark.medium
def test_rollout_says_a_registry_that_does_not_answer_is_unreachable_and_exits_1(tmp_path: Path) -> None:
    with models_only_engine() as engine:
        result = _rollout(
            "--dataset",
            "no-such-dataset",
            "--harness",
            "oracle",
            "--engine",
            engine,
            registry=f"http://127.0.0.1:{free_port()}",
            tmp=tmp_path,
        )
    assert result.returncode == EXIT_COULD_NOT_RUN, result.stderr
    line = _last_line(result)
    assert line.startswith(
        "tapdeck rollout: server error on POST /admin/runs (502): dataset source "
        "unreachable: the Harbor registry did not answer (ConnectError: "
    ), line
    assert (
        "so whether 'no-such-dataset' names a dataset there is not known (there is no folder "
        "of that name here)"
    ) in line


@pytest.mark.medium
def test_a_registry_that_takes_the_lookup_but_never_answers_counts_as_unreachable() -> None:
    # The lookup runs out of the time it is given (its error then has no cause to read).
    script = (
        "from tapdeck.runner.catalog import dataset_problem\n"
        "from tapdeck.runner.datasets import DatasetError, resolve_dataset\n"
        "try:\n"
        "    resolve_dataset('no-such-dataset', timeout_s=1)\n"
        "except DatasetError as exc:\n"
        "    problem = dataset_problem('no-such-dataset', exc)\n"
        "    print(problem.unreachable)\n"
        "    print(problem.message)\n"
    )
    with registry_never_answering() as registry:
        result = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
            env=os.environ | {REGISTRY_URL_VAR: registry},
            check=False,
        )
    assert result.returncode == 0, result.stderr
    unreachable, message = result.stdout.strip().splitlines()
    assert unreachable == "True"
    assert message.startswith(
        "dataset source unreachable: the Harbor registry did not answer (no "
        "answer in time), so whether 'no-such-dataset' names a dataset"
    ), message


@pytest.fixture
def dataset_with_a_broken_task(tmp_path: Path) -> SimpleNamespace:
    """A dataset of the sample's `hello-file` and a `greet-script` whose task.toml is not TOML."""
    dataset = tmp_path / "dataset"
    for name in ("hello-file", "greet-script"):
        shutil.copytree(SAMPLE_DATASET_DIR / name, dataset / name)
    toml = dataset / "greet-script" / "task.toml"
    toml.write_text("this is [not toml\n")
    return SimpleNamespace(
        path=dataset,
        why=f"{toml}: not TOML (Expected '=' after a key in a key/value pair (at line 1, column 6))",
    )


@pytest.mark.medium
def test_rollout_refuses_a_named_task_whose_task_toml_harbor_cannot_read_saying_why(
    dataset_with_a_broken_task: SimpleNamespace, tmp_path: Path
) -> None:
    with models_only_engine() as engine:
        result = CliRunner().invoke(
            app,
            [
                "rollout",
                "--dataset",
                str(dataset_with_a_broken_task.path),
                "--task",
                "greet-script",
                "--harness",
                "oracle",
                "--engine",
                engine,
                "--data-dir",
                str(tmp_path / "data"),
            ],
        )
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.output.strip().splitlines()[-1] == (
        "tapdeck rollout: POST /admin/runs refused (400): not a task Harbor can run: "
        f"{dataset_with_a_broken_task.why}"
    )


@pytest.mark.slow
def test_rollout_of_a_dataset_with_a_broken_task_warns_naming_it_and_runs_the_rest(
    dataset_with_a_broken_task: SimpleNamespace, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    with models_only_engine() as engine:
        result = CliRunner().invoke(
            app,
            [
                "rollout",
                "--dataset",
                str(dataset_with_a_broken_task.path),
                "--harness",
                "oracle",
                "--timeout",
                "120",
                "--engine",
                engine,
                "--data-dir",
                str(data),
            ],
        )
    assert result.exit_code == EXIT_OK, result.output
    warning = f"tapdeck rollout: warning: {dataset_with_a_broken_task.why}; task left out"
    assert warning in result.output.splitlines()
    [run_dir] = (data / "runs").iterdir()
    plan = json.loads((run_dir / "plan.json").read_text())
    assert [t["name"] for t in plan["tasks"]] == ["hello-file"]
    assert plan["left_out"] == [dataset_with_a_broken_task.why]
