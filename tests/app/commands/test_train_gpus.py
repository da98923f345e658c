"""grpo-trl's GPU split through a real server: `tapdeck train --dry-run` prints vLLM's command and
the trainer's with the GPU each gets, a launch's trainer process sees its own GPU alone, and a
refusal names what the server saw. The server runs in this process on fake device nodes
(`TAPDECK_DEV_DIR`)."""

from __future__ import annotations

import os
import shlex
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tapdeck.runner.recipes import RECIPES, Recipe
from tapdeck.schema.train import TrainPlan, TrainRunInfo
from tests.app.commands.test_train_cli import train

pytestmark = pytest.mark.medium


@pytest.fixture
def gpu_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two fake GPUs for the server in this process, and a training environment that is this Python."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    monkeypatch.setenv("TAPDECK_DEV_DIR", str(dev))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    env = tmp_path / "train-env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.setenv("TAPDECK_TRAIN_ENV", str(env))
    return dev


def test_dry_run_prints_vllms_and_the_trainers_commands_and_their_gpus(
    train_server: Any, gpu_box: Path
) -> None:
    args = ["--model", "/models/qwen", "--vllm-url", "http://localhost:8011", "--max-steps", "1"]
    out = train(train_server, "--recipe", "grpo-trl", "--dry-run", "--", *args)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"[tapdeck] dry run of grpo-trl on {train_server.url}: nothing started"
    assert lines[1] == "vllm (you start it; GPU 0):"
    assert lines[2] == (
        "  CUDA_VISIBLE_DEVICES=0 VLLM_SERVER_DEV_MODE=1 vllm serve /models/qwen --host 0.0.0.0 "
        "--port 8011 --logprobs-mode processed_logprobs --return-tokens-as-token-ids "
        '--weight-transfer-config \'{"backend":"nccl"}\' --enable-auto-tool-choice '
        "--tool-call-parser hermes"
    )
    assert lines[3] == "trainer (the server starts it; GPU 1):"
    trainer = shlex.split(lines[4])
    assert trainer[0] == "CUDA_VISIBLE_DEVICES=1"
    python = trainer.index(str(gpu_box.parent / "train-env" / "bin" / "python"))
    assert trainer[python:] == [trainer[python], "-u", "-m", "tapdeck.runner.recipes.grpo_trl", *args]
    assert not any(a.startswith("TAPDECK_ADMIN_KEY=") for a in trainer)  # a secret is never shown
    assert lines[5].startswith("note: the run id (t-")
    assert not list((Path(train_server.config.data_dir) / "train").glob("*/run.json"))  # nothing started

    # The options choose the other way round; the reply is the typed plan.
    plan = train_server.http.post(
        "/admin/train/plan",
        json={"recipe": "grpo-trl", "args": ["--vllm-gpus", "1", "--trainer-gpus", "0"]},
    )
    assert plan.status_code == 200, plan.text
    commands = TrainPlan.model_validate(plan.json()).commands
    assert [(c.role, c.started_by, c.gpus) for c in commands] == [
        ("vllm", "operator", ["1"]),
        ("trainer", "server", ["0"]),
    ]
    assert commands[0].env["CUDA_VISIBLE_DEVICES"] == "1" and commands[1].env["CUDA_VISIBLE_DEVICES"] == "0"


def test_a_cpu_recipes_dry_run_has_no_gpu_split(train_server: Any, gpu_box: Path) -> None:
    out = train(train_server, "--recipe", "cpu-grpo", "--dry-run", "--", "--steps", "2")
    assert out.returncode == 0, out.stderr
    assert "trainer (the server starts it; no GPU split):" in out.stdout
    assert "CUDA_VISIBLE_DEVICES" in out.stdout.splitlines()[-1]  # the note saying it is left alone
    assert "vllm (" not in out.stdout


@pytest.mark.parametrize(
    ("visible", "seen"),
    [
        ("1", "1 usable (GPU 1; device nodes in {dev}: nvidia0, nvidia1; CUDA_VISIBLE_DEVICES='1')"),
        ("", "0 usable (no GPU; device nodes in {dev}: nvidia0, nvidia1; CUDA_VISIBLE_DEVICES='')"),
        (
            "GPU-1234",
            "0 usable (no GPU; device nodes in {dev}: nvidia0, nvidia1; CUDA_VISIBLE_DEVICES='GPU-1234' "
            "('GPU-1234' is not a GPU index; tapdeck splits GPUs by index))",
        ),
    ],
)
def test_a_launch_without_two_usable_gpus_is_refused_naming_what_the_server_saw(
    train_server: Any, gpu_box: Path, monkeypatch: pytest.MonkeyPatch, visible: str, seen: str
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)  # the server's: it runs in this process
    needs = "grpo-trl needs 2 GPUs (1 for vLLM, 1 for the trainer, not shared); the server has "
    for extra in (["--dry-run"], []):
        out = train(train_server, "--recipe", "grpo-trl", *extra)
        assert out.returncode == 1
        assert needs + seen.format(dev=gpu_box) in out.stderr
    listed = train(train_server, "--list")
    assert "grpo-trl  [cannot start there]" in listed.stdout
    assert needs + seen.format(dev=gpu_box) in listed.stdout


ECHO_RECIPE = textwrap.dedent(
    """
    import argparse, os
    from tapdeck.runner.recipes.gpu_split import add_gpu_options

    def arg_parser():
        p = argparse.ArgumentParser(prog="gpu-echo", allow_abbrev=False)
        add_gpu_options(p)
        return p

    def engine_command(args, gpus):
        return {"CUDA_VISIBLE_DEVICES": ",".join(gpus)}, ["vllm", "serve", "m"]

    if __name__ == "__main__":
        print("trainer sees CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
    """
)


def test_the_trainers_process_gets_only_its_own_gpu(
    train_server: Any, gpu_box: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "gpu_echo_recipe.py").write_text(ECHO_RECIPE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setitem(
        RECIPES,
        "gpu-echo",
        Recipe(
            name="gpu-echo",
            module="gpu_echo_recipe",
            summary="",
            where="GPU box",
            updates_weights=False,
            gpu_split=True,
        ),
    )
    # The server itself sees both GPUs; the trainer's process must see its own alone.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    reply = train_server.http.post("/admin/train", json={"recipe": "gpu-echo", "args": ["--vllm-gpus", "1"]})
    assert reply.status_code == 200, reply.text
    job = TrainRunInfo.model_validate(reply.json())
    deadline = time.monotonic() + 60
    while (info := train_server.http.get(f"/admin/train/{job.id}").json())["state"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert info["state"] == "finished", info
    log = (Path(job.run_dir) / "train.log").read_text().splitlines()
    assert log == [
        "[tapdeck] vLLM on GPU 1, trainer on GPU 0 (CUDA_VISIBLE_DEVICES=0 for the trainer); vLLM must "
        "serve on its GPU: CUDA_VISIBLE_DEVICES=1 vllm serve m",
        "trainer sees CUDA_VISIBLE_DEVICES=0",
    ]
