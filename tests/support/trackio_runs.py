"""Real trackio databases for tests: `write_trackio` logs with the trackio package itself, in a fresh
interpreter as a recipe would; `eval_run_logs` is what cpu-grpo logs around its held-out eval (the
metric names of `tapdeck.app.eval_reward`), with figures whose summary line is known."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

WRITER = """
import json, sys, trackio
spec = json.loads(sys.argv[1])
trackio.init(project=spec["project"], name=spec["name"], config={"lr": 1e-6})
for entry in spec["logs"]:
    trackio.log(entry["metrics"], step=entry.get("step"))
trackio.finish()
"""


def write_trackio(trackio_dir: Path, project: str, name: str, logs: list[dict[str, Any]]) -> None:
    """Log `logs` (each `{"metrics": {...}, "step": N}`) with the real trackio package in a fresh
    interpreter (as a recipe would)."""
    spec = json.dumps({"project": project, "name": name, "logs": logs})
    env = {**os.environ, "TRACKIO_DIR": str(trackio_dir)}
    out = subprocess.run(
        [sys.executable, "-c", WRITER, spec], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr


STEPS = 3
EVAL_SUMMARY = (
    "eval verifier reward 0.15 (n 40, 95% CI 0.07–0.29) → 0.42 (n 40, 0.28–0.57); "
    "Δ +0.27 (95% CI +0.08–+0.46)"
)
"""The line `tapdeck train` ends `eval_run_logs()`'s run with."""


def _eval(reward: float, low: float, high: float, tasks: dict[str, tuple[float, int]]) -> dict[str, float]:
    metrics = {
        "eval/verifier_reward": reward,
        "eval/verifier_reward_ci_low": low,
        "eval/verifier_reward_ci_high": high,
        "eval/n": sum(n for _, n in tasks.values()),
    }
    for task, (mean, n) in tasks.items():
        metrics[f"eval/task/{task}/verifier_reward"] = mean
        metrics[f"eval/task/{task}/n"] = n
    return metrics


def eval_run_logs(*, with_eval: bool = True) -> list[dict[str, Any]]:
    """A three-step cpu-grpo run's trackio logs: the eval at step 0 (before any optimizer step),
    each step's TRL metrics and per-task training reward (hello-file drawn at every step,
    sum-numbers at steps 2 and 3), the eval and its difference at step 3. `with_eval=False`: the
    training metrics alone, as a run from before the eval (or one that skips it) logs."""
    train = {
        1: {"hello-file": (0.25, 4)},
        2: {"hello-file": (0.5, 4), "sum-numbers": (0.0, 4)},
        3: {"hello-file": (0.75, 4), "sum-numbers": (0.5, 4)},
    }
    logs: list[dict[str, Any]] = []
    if with_eval:
        before = _eval(0.15, 0.07, 0.29, {"hello-file": (0.25, 20), "sum-numbers": (0.05, 20)})
        logs.append({"metrics": before, "step": 0})
    for step, tasks in train.items():
        metrics: dict[str, float] = {
            "train/reward": 0.2 * step + 0.1,
            "train/reward_std": 0.1,
            "train/rewards/verifier/mean": 0.1 * step,
            "train/loss": 0.5 / step,
        }
        for task, (mean, n) in tasks.items():
            metrics[f"train/task/{task}/verifier_reward"] = mean
            metrics[f"train/task/{task}/n"] = n
        logs.append({"metrics": metrics, "step": step})
    if with_eval:
        after = _eval(0.42, 0.28, 0.57, {"hello-file": (0.6, 20), "sum-numbers": (0.25, 20)})
        delta = {
            "eval/verifier_reward_delta": 0.27,
            "eval/verifier_reward_delta_ci_low": 0.08,
            "eval/verifier_reward_delta_ci_high": 0.46,
        }
        logs.append({"metrics": {**after, **delta}, "step": STEPS})
    return logs
