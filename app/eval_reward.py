"""Whether a training run learned, from its trackio metrics, free of Textual: the verifier reward
of its held-out eval before training and after it (each with its n and 95% interval, and the
difference's), and per task the training rollouts and their mean verifier reward next to that
task's eval before and after. cpu-grpo logs them (names below, as trackio stores them); a run that
logged none (data-check, grpo-trl, an older run) reads as None or no tasks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Series = Mapping[str, Sequence[tuple[int, float]]]
"""Metric name → (step, value) points in logging order, as the server's trackio reader gives them."""

EVAL = "eval/verifier_reward"
EVAL_N = "eval/n"
DELTA = "eval/verifier_reward_delta"
LOW, HIGH = "_ci_low", "_ci_high"
"""Suffixes of a figure's 95% interval bounds (`eval/verifier_reward_ci_low`, …)."""
EVAL_TASK = "eval/task/"
TRAIN_TASK = "train/task/"
"""Per task T: `<prefix>T/verifier_reward` and `<prefix>T/n` (eval at its two steps, train at each
step that drew T)."""
REWARD, COUNT = "/verifier_reward", "/n"


@dataclass(frozen=True, slots=True)
class Estimate:
    """A mean verifier reward at one step, with how many rollouts it averages and its 95% interval
    (None where the run did not log them)."""

    step: int
    value: float
    n: int | None = None
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True, slots=True)
class EvalReward:
    """The eval before training and after it (None: not run, e.g. a run stopped before its last
    step) and the after − before difference the run logged."""

    before: Estimate
    after: Estimate | None
    delta: Estimate | None


@dataclass(frozen=True, slots=True)
class TaskReward:
    """One task over a run: its training rollouts, their mean verifier reward, its eval before and
    after training."""

    task: str
    train_n: int
    train_reward: float | None
    eval_before: Estimate | None
    eval_after: Estimate | None


def _at(points: Series, name: str, step: int) -> float | None:
    """The value `name` was last logged with at `step`, or None."""
    return next((v for s, v in reversed(points.get(name) or []) if s == step), None)


def _estimate(points: Series, name: str, step: int, value: float, n_name: str | None = None) -> Estimate:
    """`name`'s value at `step` with its interval, and its n when it has one, logged at that step."""
    n = None if n_name is None else _at(points, n_name, step)
    low, high = _at(points, name + LOW, step), _at(points, name + HIGH, step)
    return Estimate(step, value, None if n is None else int(n), low, high)


def _before_after(points: Series, name: str, n_name: str) -> tuple[Estimate | None, Estimate | None]:
    """The first and, when there is a second, the last point of an eval metric, with their n and
    interval logged at the same steps."""
    logged = list(points.get(name) or [])
    if not logged:
        return None, None
    before = _estimate(points, name, *logged[0], n_name=n_name)
    after = _estimate(points, name, *logged[-1], n_name=n_name) if len(logged) > 1 else None
    return before, after


def eval_reward(points: Series) -> EvalReward | None:
    """The run's eval verifier reward before and after training, or None when it logged no eval."""
    before, after = _before_after(points, EVAL, EVAL_N)
    if before is None:
        return None
    deltas = list(points.get(DELTA) or [])
    delta = _estimate(points, DELTA, *deltas[-1]) if deltas else None
    return EvalReward(before, after, delta)


def _tasks(points: Series, prefix: str) -> set[str]:
    return {
        name.removeprefix(prefix).removesuffix(REWARD)
        for name in points
        if name.startswith(prefix) and name.endswith(REWARD) and len(name) > len(prefix) + len(REWARD)
    }


def task_rewards(points: Series) -> list[TaskReward]:
    """Per task the run logged (training or eval), sorted by name: its training rollouts and their
    mean verifier reward (each step's mean weighted by its n; a step logged without its n counts
    in neither), and its eval before and after."""
    out = []
    for task in sorted(_tasks(points, TRAIN_TASK) | _tasks(points, EVAL_TASK)):
        train = TRAIN_TASK + task
        n_total, weighted = 0, 0.0
        for step, reward in points.get(train + REWARD) or []:
            n = _at(points, train + COUNT, step)
            if n:
                n_total += int(n)
                weighted += reward * n
        before, after = _before_after(points, EVAL_TASK + task + REWARD, EVAL_TASK + task + COUNT)
        mean = weighted / n_total if n_total else None
        out.append(TaskReward(task, n_total, mean, before, after))
    return out


def fmt_estimate(e: Estimate, *, ci_label: bool = True) -> str:
    """`0.15 (n 40, 95% CI 0.07–0.29)`; what was not logged is left out."""
    facts = [] if e.n is None else [f"n {e.n}"]
    if e.low is not None and e.high is not None:
        facts.append(f"{'95% CI ' if ci_label else ''}{e.low:.2f}–{e.high:.2f}")
    return f"{e.value:.2f}" + (f" ({', '.join(facts)})" if facts else "")


def summary_line(ev: EvalReward) -> str:
    """`eval verifier reward 0.15 (n 40, 95% CI 0.07–0.29) → 0.42 (n 40, 0.28–0.57); Δ +0.27 (95%
    CI +0.08–+0.46)`. Without an eval after training it says so; without a logged difference the
    plain one is given, with no interval."""
    line = f"eval verifier reward {fmt_estimate(ev.before)}"
    if ev.after is None:
        return f"{line} before training; none after it (the run ended before its last step)"
    line += f" → {fmt_estimate(ev.after, ci_label=False)}"
    if ev.delta is None:
        return f"{line}; Δ {ev.after.value - ev.before.value:+.2f}"
    d = ev.delta
    ci = f" (95% CI {d.low:+.2f}–{d.high:+.2f})" if d.low is not None and d.high is not None else ""
    return f"{line}; Δ {d.value:+.2f}{ci}"
