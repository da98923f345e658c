"""What a run's eval and per-task metrics say when some are missing: a run stopped before its last
step, one that logged no difference or no intervals, a step logged without its n, none at all."""

from __future__ import annotations

from tapdeck.app.eval_reward import Estimate, TaskReward, eval_reward, summary_line, task_rewards

BEFORE = {
    "eval/verifier_reward": [(0, 0.15)],
    "eval/verifier_reward_ci_low": [(0, 0.07)],
    "eval/verifier_reward_ci_high": [(0, 0.29)],
    "eval/n": [(0, 40.0)],
}


def test_a_run_that_logged_no_eval_has_none() -> None:
    assert eval_reward({"train/reward": [(1, 0.5)]}) is None
    assert task_rewards({"train/reward": [(1, 0.5)]}) == []


def test_a_run_stopped_before_its_last_step_has_the_eval_before_alone() -> None:
    ev = eval_reward({**BEFORE, "train/reward": [(1, 0.5)]})
    assert ev is not None and ev.after is None and ev.delta is None
    assert ev.before == Estimate(0, 0.15, 40, 0.07, 0.29)
    assert summary_line(ev) == (
        "eval verifier reward 0.15 (n 40, 95% CI 0.07–0.29) before training; "
        "none after it (the run ended before its last step)"
    )


def test_without_a_logged_difference_or_intervals_the_line_gives_what_there_is() -> None:
    ev = eval_reward({"eval/verifier_reward": [(0, 0.15), (4, 0.5)], "eval/n": [(0, 40.0), (4, 38.0)]})
    assert ev is not None
    assert summary_line(ev) == "eval verifier reward 0.15 (n 40) → 0.50 (n 38); Δ +0.35"


def test_a_difference_without_its_interval_is_given_without_one() -> None:
    points = {
        **BEFORE,
        "eval/verifier_reward": [(0, 0.15), (2, 0.1)],
        "eval/verifier_reward_delta": [(2, -0.05)],
    }
    ev = eval_reward(points)
    assert ev is not None and ev.after == Estimate(2, 0.1)  # its n and interval logged at step 0 only
    assert summary_line(ev).endswith("→ 0.10; Δ -0.05")


def test_a_tasks_training_reward_weighs_each_step_by_its_rollouts() -> None:
    points = {
        "train/task/a/verifier_reward": [(1, 1.0), (2, 0.0), (3, 0.5)],
        "train/task/a/n": [(1, 2.0), (2, 6.0)],  # step 3 logged no n: counted in neither
        "eval/task/b/verifier_reward": [(0, 0.2), (3, 0.4)],
        "eval/task/b/n": [(0, 5.0), (3, 5.0)],
    }
    assert task_rewards(points) == [
        TaskReward("a", 8, 0.25, None, None),
        TaskReward("b", 0, None, Estimate(0, 0.2, 5), Estimate(3, 0.4, 5)),
    ]
