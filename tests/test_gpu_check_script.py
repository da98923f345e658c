"""scripts/gpu-check.sh, as far as a machine without a GPU can check it: it parses, its --dry-run
prints every step's command (vLLM's the one grpo-trl's rule gives it) and starts nothing, and it
refuses to run without the model folder it needs. The GPU steps themselves run only on a GPU box."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from tapdeck.runner.recipes.grpo_trl import vllm_command

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in {**os.environ, **env}.items() if k != "MODEL_DIR" or "MODEL_DIR" in env},
    )


def test_the_script_parses() -> None:
    out = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def test_dry_run_prints_each_steps_command_and_starts_nothing() -> None:
    out = run("--dry-run", MODEL_DIR="/models/qwen2.5-0.5b")
    assert out.returncode == 0, out.stderr
    shown = [line.removeprefix("[gpu-check] $ ") for line in out.stdout.splitlines() if "] $ " in line]
    assert len(shown) == 5
    train_dry, vllm, rollout, serve, train = (shlex.split(line) for line in shown)
    assert train_dry[1:5] == ["train", "--recipe", "grpo-trl", "--dry-run"]
    env, argv = vllm_command("/models/qwen2.5-0.5b", gpus=["0"])
    assert vllm == [f"{k}={v}" for k, v in env.items()] + argv + [
        "--max-model-len",
        "8192",
        "--gpu-memory-utilization",
        "0.5",
    ]
    assert rollout[1:3] == ["rollout", "--engine"] and rollout[3] == "http://127.0.0.1:8000/v1"
    assert serve[1:] == ["serve", "--port", "8300"]
    assert train[1:6] == ["train", "--server", "http://127.0.0.1:8300", "--recipe", "grpo-trl"]
    assert train[train.index("--") + 1 :] == train_dry[train_dry.index("--") + 1 :]
    assert "$DATA" in " ".join(train)  # no scratch folder made, no process started


def test_without_a_model_folder_it_is_bad_usage() -> None:
    out = run("--dry-run")
    assert out.returncode == 2 and "set MODEL_DIR" in out.stderr
    assert run("--dry-run", "--extra", MODEL_DIR="/m").returncode == 2
