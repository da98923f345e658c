"""cpu-grpo's eval around training and its per-task rewards: the figures it logs, their intervals
and the refusals of an eval that is not held out."""

from __future__ import annotations

import argparse
import math
from types import SimpleNamespace
from typing import Any

import pytest

from tapdeck.runner.recipes.cpu_grpo import (
    TapdeckRollouts,
    arg_parser,
    delta_metrics,
    eval_line,
    eval_metrics,
    eval_split,
    verifier,
)
from tapdeck.runner.recipes.reward_interval import difference_interval, mean_interval, wilson


def test_wilson_matches_its_closed_form_and_stays_inside_0_and_1() -> None:
    low, high = wilson(0, 20)
    assert low == 0.0 and high == pytest.approx(0.1611, abs=1e-4)  # 3.84 / 23.84
    low, high = wilson(10, 20)
    assert (low, high) == (pytest.approx(0.2993, abs=1e-4), pytest.approx(0.7007, abs=1e-4))
    assert wilson(20, 20)[1] == 1.0


def test_a_mean_of_graded_and_fractional_rewards_and_its_interval() -> None:
    mean, low, high = mean_interval([1.0, 0.0, 0.0, 0.0])
    assert mean == 0.25 and 0 < low < 0.25 < high < 1
    mean, low, high = mean_interval([0.5, 0.25, 0.75])  # not all 0/1: the normal approximation
    assert mean == 0.5 and high - mean == pytest.approx(mean - low)
    assert high - mean == pytest.approx(1.959964 * 0.25 / math.sqrt(3))
    with pytest.raises(ValueError):
        mean_interval([])


def test_the_interval_of_a_change_excludes_0_only_when_the_change_is_clear() -> None:
    delta, low, high = difference_interval([0.0] * 40, [1.0] * 12 + [0.0] * 28)
    assert delta == pytest.approx(0.3) and 0 < low < delta < high
    delta, low, high = difference_interval([1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0])
    assert delta == 0.25 and low < 0 < high  # 4 rollouts a side prove nothing


def test_eval_metrics_are_the_names_the_train_screen_reads() -> None:
    rewards = {"reply-snack": [1.0, 0.0], "run-pet": [0.0, 0.0], "run-month": []}
    m = eval_metrics(rewards)
    assert m["eval/verifier_reward"] == 0.25 and m["eval/n"] == 4.0
    assert m["eval/verifier_reward_ci_low"] < 0.25 < m["eval/verifier_reward_ci_high"]
    assert m["eval/task/reply-snack/verifier_reward"] == 0.5 and m["eval/task/reply-snack/n"] == 2.0
    assert m["eval/task/run-month/n"] == 0.0 and "eval/task/run-month/verifier_reward" not in m
    assert eval_line(m).startswith("0.25 (n 4, 95% CI 0.0")
    assert eval_metrics({"t": []}) == {"eval/n": 0.0, "eval/task/t/n": 0.0}
    assert eval_line(eval_metrics({"t": []})) == "no graded rollout"
    after = {"reply-snack": [1.0, 1.0], "run-pet": [1.0, 0.0]}
    d = delta_metrics(rewards, after)
    assert d["eval/verifier_reward_delta"] == 0.5
    assert d["eval/verifier_reward_delta_ci_low"] < 0.5 < d["eval/verifier_reward_delta_ci_high"]
    assert delta_metrics({"t": []}, after) == {}


def test_each_step_logs_every_drawn_tasks_mean_verifier_reward_over_its_graded_rollouts() -> None:
    logged: dict[str, float] = {}
    stats = {"scorable": 1.0, "degenerate": 0.0}
    out = verifier(
        [],
        [],
        [1.0, 0.0, None, 0.0, 0.0],
        [stats] * 5,
        log_metric=logged.__setitem__,
        task_names=["a", "a", "a", "b", "b"],
    )
    assert out == [1.0, 0.0, None, 0.0, 0.0]
    assert logged["task/a/verifier_reward"] == 0.5 and logged["task/a/n"] == 2.0  # None is not a 0
    assert logged["task/b/verifier_reward"] == 0.0 and logged["task/b/n"] == 2.0


class Catalog:
    """The server's `/admin/catalog` answer for the shipped datasets."""

    def get(self, path: str, timeout: float = 0) -> Any:
        assert path == "/admin/catalog"
        datasets = [
            {"name": "sample", "tasks": [{"name": "hello-file"}, {"name": "sum-numbers"}]},
            {"name": "learn", "tasks": [{"name": "reply-fruit"}, {"name": "run-tree"}]},
            {"name": "learn-eval", "tasks": [{"name": "reply-snack"}, {"name": "run-pet"}]},
        ]
        return SimpleNamespace(json=lambda: {"datasets": datasets}, raise_for_status=lambda: None)


def parse(*argv: str) -> argparse.Namespace:
    return arg_parser().parse_args(["--server", "http://x", *argv])


def test_the_eval_split_is_held_out_and_named_whole() -> None:
    http: Any = Catalog()
    assert eval_split(http, parse("--dataset", "learn"), ["reply-fruit"]) == []
    args = parse("--dataset", "learn", "--eval-dataset", "learn-eval")
    assert eval_split(http, args, ["reply-fruit", "run-tree"]) == ["reply-snack", "run-pet"]
    args = parse("--tasks", "hello-file", "--eval-dataset", "sample", "--eval-tasks", "sum-numbers")
    assert eval_split(http, args, ["hello-file"]) == ["sum-numbers"]
    overlap = r"^eval task\(s\) hello-file, sum-numbers are also trained on: an eval must be held out"
    with pytest.raises(ValueError, match=overlap):
        eval_split(http, parse("--eval-dataset", "sample"), ["hello-file", "sum-numbers"])
    with pytest.raises(ValueError, match="--eval-tasks needs --eval-dataset"):
        eval_split(http, parse("--eval-tasks", "run-pet"), ["hello-file"])
    with pytest.raises(ValueError, match="unknown task"):
        eval_split(http, parse("--eval-dataset", "learn-eval", "--eval-tasks", "run-cat"), ["x"])


class EvalServer:
    """The server side of one eval run: its plan is kept, its rollouts are given."""

    def __init__(self, rollouts: list[dict]) -> None:
        self.rollouts = rollouts
        self.posted: list[tuple[str, dict]] = []

    def post(self, path: str, json: dict | None = None, timeout: float = 0) -> Any:
        self.posted.append((path, json or {}))
        return SimpleNamespace(status_code=200, json=lambda: {"id": "run-1"}, text="")

    def get(self, path: str) -> Any:
        doc = {"state": "finished", "rollouts": self.rollouts}
        return SimpleNamespace(json=lambda: doc, raise_for_status=lambda: None)


def test_an_eval_runs_every_eval_task_k_times_on_the_policy_and_leaves_ungraded_ones_out(capsys) -> None:
    from tapdeck.schema.runs import RolloutTemplate, RunPlan

    server = EvalServer(
        [
            {"task": "reply-snack", "reward": 1.0},
            {"task": "reply-snack", "reward": 0.0},
            {"task": "run-pet", "reward": None, "error_kind": "sandbox_failed", "error": "boom"},
            {"task": "run-pet", "reward": 0.0},
        ]
    )
    engine = SimpleNamespace(base_url="http://127.0.0.1:9/v1", changed=0)
    engine.weights_changed = lambda: setattr(engine, "changed", engine.changed + 1)
    plan = RunPlan(dataset="learn", rollout=RolloutTemplate(harness="terminus-2"))
    rollouts = TapdeckRollouts(server, engine, group_size=4, plan=plan, timeout_s=60, eos_id=0)
    rewards = rollouts.evaluate("learn-eval", ["reply-snack", "run-pet"], 2, step=3)
    assert rewards == {"reply-snack": [1.0, 0.0], "run-pet": [0.0]}
    assert engine.changed == 1  # no reply continues from keys of older weights
    (version_path, version), (runs_path, run) = server.posted
    assert version_path == "/admin/engines/version" and version["version"] == 3
    assert runs_path == "/admin/runs"
    assert run["dataset"] == "learn-eval" and run["tasks"] == ["reply-snack", "run-pet"] and run["k"] == 2
    assert run["rollout"]["engine"] == engine.base_url
    assert "eval rollout of run-pet not graded: sandbox_failed boom" in capsys.readouterr().out
    assert rollouts.active == set()


def test_a_reply_cut_at_the_token_limit_keeps_half_its_format_credit() -> None:
    from tapdeck.runner.recipes.cpu_grpo import reply_credit, reply_texts

    whole = '{"analysis": "", "plan": "", "commands": []}'
    doc = {
        "turns": [
            {"role": "agent", "finish_reason": "stop", "response": {"content": whole}},
            {"role": "auxiliary", "finish_reason": "stop", "response": {"content": "title"}},
            {"role": "agent", "finish_reason": "length", "response": {"content": whole}},
            {"role": "agent", "finish_reason": "stop", "response": {"content": None}},
        ]
    }
    replies = reply_texts(doc)
    assert replies == [(whole, True), (whole, False), ("", True)]
    assert reply_credit(replies) == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert reply_credit([]) == 0.0
