"""Dataset resolution: the shipped sample, local folders (Harbor's rule), remote specs offline."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from harbor.models.task.task import Task

from tapdeck.runner import datasets
from tapdeck.runner.datasets import DatasetError, DatasetTimeout, resolve_dataset

SAMPLE_TASKS = ["fizzbuzz-python", "greet-script", "hello-file", "json-config", "sum-numbers"]


def test_none_and_sample_resolve_to_the_shipped_sample_dataset() -> None:
    for spec in (None, "sample", " sample "):
        ds = resolve_dataset(spec)
        assert ds.name == "sample"
        assert [t.name for t in ds.tasks] == SAMPLE_TASKS
    assert (
        resolve_dataset(None).task("sum-numbers").instruction
        == "Add up these numbers: 17, 23, 58, 4, 91 and 305."
    )


def test_every_sample_task_is_a_valid_harbor_task_with_sensible_timeouts() -> None:
    from harbor.models.task.config import TaskConfig

    tasks = resolve_dataset(None).tasks
    assert [ref.name for ref in tasks] == SAMPLE_TASKS
    for ref in tasks:
        assert Task.is_valid_dir(ref.path)
        config = TaskConfig.model_validate_toml((ref.path / "task.toml").read_text())
        assert config.schema_version == "1.4"
        assert config.agent.timeout_sec == 180.0 and config.verifier.timeout_sec == 60.0
        for rel in ("instruction.md", "environment/Dockerfile", "tests/test.sh", "solution/solve.sh"):
            assert (ref.path / rel).is_file(), f"{ref.name}: {rel} missing"
        assert os.access(ref.path / "tests" / "test.sh", os.X_OK)
        assert ref.instruction and "\n" not in ref.instruction


def test_sample_dataset_is_shipped_as_package_data() -> None:
    text = (Path(datasets.__file__).parents[1] / "pyproject.toml").read_text()
    assert '"tapdeck.runner" = ["sample_dataset/**/*"]' in text


def test_a_local_task_folder_is_one_task(tmp_path: Path) -> None:
    task = shutil.copytree(datasets.SAMPLE_DATASET_DIR / "hello-file", tmp_path / "only")
    ds = resolve_dataset(str(task))
    assert [t.name for t in ds.tasks] == ["only"]
    assert ds.tasks[0].instruction.startswith("Create a file named `hello.txt`")


def test_a_task_carries_its_whole_instruction_for_a_preview_and_its_opening_line(tmp_path: Path) -> None:
    task = shutil.copytree(datasets.SAMPLE_DATASET_DIR / "hello-file", tmp_path / "long")
    body = "# Make a file\n\nCreate `hello.txt`\nholding one line.\n\n## Checks\n\n" + "x" * 5000
    (task / "instruction.md").write_text(body)
    [ref] = resolve_dataset(str(task)).tasks
    assert ref.instruction == "Make a file"  # the first paragraph only, for a table row
    assert ref.instruction_text.startswith("# Make a file\n\nCreate `hello.txt`\nholding one line.")
    assert len(ref.instruction_text) == datasets.INSTRUCTION_TEXT_MAX_CHARS
    assert ref.instruction_text.endswith("x…")


def test_a_local_folder_of_tasks_lists_valid_subfolders_sorted(tmp_path: Path) -> None:
    shutil.copytree(datasets.SAMPLE_DATASET_DIR / "sum-numbers", tmp_path / "b-task")
    shutil.copytree(datasets.SAMPLE_DATASET_DIR / "hello-file", tmp_path / "a-task")
    (tmp_path / "not-a-task").mkdir()
    (tmp_path / "README.md").write_text("x")
    ds = resolve_dataset(str(tmp_path))
    assert [t.name for t in ds.tasks] == ["a-task", "b-task"]
    assert ds.source == str(tmp_path.resolve())


def test_a_folder_without_tasks_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no Harbor task"):
        resolve_dataset(str(tmp_path))
    with pytest.raises(DatasetError, match="does not exist"):
        resolve_dataset(str(tmp_path / "missing"))


def test_task_lookup_names_the_available_tasks() -> None:
    with pytest.raises(KeyError, match="hello-file"):
        resolve_dataset(None).task("nope")


def test_remote_specs_map_to_harbor_dataset_configs() -> None:
    cfg = datasets._remote_dataset_config("terminal-bench@2.0")
    assert cfg.is_registry() and cfg.name == "terminal-bench" and cfg.version == "2.0"
    cfg = datasets._remote_dataset_config("harbor/hello-world")
    assert cfg.is_package() and cfg.ref == "latest"
    cfg = datasets._remote_dataset_config("https://huggingface.co/datasets/org/tasks@main")
    assert cfg.is_repo()
    cfg = datasets._remote_dataset_config("repo:org/tasks")
    assert cfg.is_repo() and cfg.repo == "org/tasks"


def test_unreachable_remote_dataset_fails_clearly_within_its_bound() -> None:
    # Port 9 on loopback refuses at once: what an offline machine sees for a git source.
    with pytest.raises(DatasetError, match="need network access") as refused:
        resolve_dataset("http://127.0.0.1:9/org/tasks.git", timeout_s=30)
    assert not isinstance(refused.value, DatasetTimeout)  # it answered, with a refusal


def _problem(spec: str):
    from tapdeck.runner.catalog import dataset_problem

    with pytest.raises(DatasetError) as failed:
        resolve_dataset(spec, timeout_s=30)
    return dataset_problem(spec, failed.value)


def test_a_git_host_that_does_not_answer_is_unreachable_in_gits_own_words() -> None:
    problem = _problem("http://127.0.0.1:9/org/tasks.git")  # refused at once
    assert problem.unreachable
    assert problem.message.startswith(
        "dataset source unreachable: the git host of http://127.0.0.1:9/org/tasks.git did not "
        "answer (git: fatal: unable to access 'http://127.0.0.1:9/org/tasks.git/': Failed to "
        "connect to 127.0.0.1 port 9"
    ), problem.message


def test_a_git_host_without_the_repository_makes_it_an_unknown_dataset(tmp_path: Path) -> None:
    import functools
    import http.server
    import threading

    # An HTTP server of an empty folder: git's smart-HTTP probe gets a 404.
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    spec = f"http://127.0.0.1:{server.server_address[1]}/org/tasks.git"
    try:
        problem = _problem(spec)
    finally:
        server.shutdown()
    assert not problem.unreachable  # a wrong spec, not an offline host: bad usage (exit 2)
    assert problem.message == (
        f"unknown dataset {spec!r}: the git host of {spec} answered, with no such repository or "
        f"ref (or one that needs credentials): git: fatal: repository '{spec}/' not found"
    )


@pytest.mark.medium
def test_a_remote_source_that_never_answers_is_cut_off_at_the_bound() -> None:
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()  # accepts connections (kernel backlog) but never answers
    port = server.getsockname()[1]
    try:
        with pytest.raises(DatasetTimeout, match="within 2 s"):
            resolve_dataset(f"http://127.0.0.1:{port}/org/tasks.git", timeout_s=2)
    finally:
        server.close()
