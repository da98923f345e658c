"""The learnable task set cpu-grpo trains on (`learn`) and its held-out eval split (`learn-eval`):
shipped, offline, valid Harbor tasks whose verifiers give 1 to the solution and 0 to doing nothing."""

from __future__ import annotations

import json

import pytest
from harbor.models.task.config import TaskConfig
from harbor.models.task.task import Task

from tapdeck.runner.catalog import dataset_catalog
from tapdeck.runner.datasets import SHIPPED_DATASETS, resolve_dataset
from tests.support.runner_server import RunnerServer

TRAIN = ["reply-color", "reply-direction", "reply-fruit", "reply-number"]
TRAIN += ["run-animal", "run-drink", "run-tree", "run-weather"]
EVAL = ["reply-paint", "reply-snack", "run-month", "run-pet"]


def test_the_learn_sets_resolve_by_name_and_the_eval_split_is_held_out() -> None:
    train, held_out = resolve_dataset("learn"), resolve_dataset(" learn-eval ")
    assert (train.name, [t.name for t in train.tasks]) == ("learn", TRAIN)
    assert (held_out.name, [t.name for t in held_out.tasks]) == ("learn-eval", EVAL)
    # Held out: no task, and no file a task writes, is shared between the splits.
    outputs = lambda ds: {(t.path / "solution" / "solve.sh").read_text().split(">")[-1] for t in ds.tasks}  # noqa: E731
    assert not outputs(train) & outputs(held_out)
    # The same two shapes on both sides: what is learnt on one is measured on the other.
    shapes = lambda ds: {t.name.split("-")[0] for t in ds.tasks}  # noqa: E731
    assert shapes(train) == shapes(held_out) == {"reply", "run"}
    listed = {d.name: [t.name for t in d.tasks] for d in dataset_catalog()}
    assert listed["learn"] == TRAIN and listed["learn-eval"] == EVAL and set(SHIPPED_DATASETS) <= set(listed)


def test_every_learn_task_is_a_valid_harbor_task_naming_its_command_or_the_reply_that_runs_it() -> None:
    for name in ("learn", "learn-eval"):
        for ref in resolve_dataset(name).tasks:
            assert Task.is_valid_dir(ref.path)
            config = TaskConfig.model_validate_toml((ref.path / "task.toml").read_text())
            assert config.agent.timeout_sec == 180.0 and config.verifier.timeout_sec == 60.0
            command = (ref.path / "solution" / "solve.sh").read_text().splitlines()[-1]
            instruction = (ref.path / "instruction.md").read_text()
            if ref.name.startswith("run-"):
                assert instruction == f"Run this command: `{command}`\n"
            else:  # terminus-2's own reply format, with that command as its one keystroke line
                reply = json.loads(instruction.split("\n", 1)[1])
                assert reply["commands"] == [{"keystrokes": command + "\n", "duration": 0.1}]
                assert reply["task_complete"] is True


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["learn", "learn-eval"])
def test_the_oracle_solves_every_learn_task_and_doing_nothing_solves_none(
    runner_server: RunnerServer, dataset: str
) -> None:
    n = len(resolve_dataset(dataset).tasks)
    for harness, reward in (("oracle", 1.0), ("nop", 0.0)):
        doc = runner_server.run(harness=harness, dataset=dataset, n_tasks=n, concurrency=4, timeout_s=120)
        assert doc["state"] == "finished" and len(doc["rollouts"]) == n
        assert {r["task"]: r["reward"] for r in doc["rollouts"]} == {
            t.name: reward for t in resolve_dataset(dataset).tasks
        }, doc["rollouts"]
