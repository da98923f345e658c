"""The GPU rule of grpo-trl's launches, on fake device nodes: what the server sees (device nodes
narrowed by CUDA_VISIBLE_DEVICES), how vLLM's GPUs and the trainer's are split, and what a refusal says."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tapdeck.runner.recipes import RECIPES
from tapdeck.runner.recipes.gpu_split import (
    GpuRefused,
    GpuSplit,
    gpu_list,
    gpu_options,
    gpu_view,
    one_gpu,
    split_gpus,
)


def nodes(tmp_path: Path, count: int) -> Path:
    """A folder standing in for /dev: `count` GPU nodes beside the ones every driver adds."""
    for name in [f"nvidia{i}" for i in range(count)] + ["nvidiactl", "nvidia-uvm", "nvidia-modeset"]:
        (tmp_path / name).touch()
    return tmp_path


@pytest.mark.parametrize(
    ("count", "visible", "usable"),
    [
        (0, None, ()),
        (1, None, ("0",)),
        (2, None, ("0", "1")),
        (2, "1", ("1",)),
        (2, "1,0", ("1", "0")),  # CUDA's order: the list's
        (4, " 2 , 3 ", ("2", "3")),
        (2, "", ()),  # set and empty hides every GPU
        (2, "0,", ("0",)),
    ],
)
def test_usable_gpus_are_the_device_nodes_narrowed_by_cuda_visible_devices(
    tmp_path: Path, count: int, visible: str | None, usable: tuple[str, ...]
) -> None:
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    view = gpu_view(env, nodes(tmp_path, count))
    assert view.visible == usable and view.problem is None
    assert view.nodes == tuple(str(i) for i in range(count))  # nvidiactl & co. are no GPU


@pytest.mark.parametrize(
    ("visible", "problem"),
    [
        ("GPU-8e6c1f2a-0000", "'GPU-8e6c1f2a-0000' is not a GPU index; tapdeck splits GPUs by index"),
        ("-1", "'-1' is not a GPU index"),
        ("0,x", "'x' is not a GPU index"),
        ("5", "no device node nvidia5"),
        ("1,1", "a GPU is named twice"),
    ],
)
def test_an_unreadable_cuda_visible_devices_leaves_nothing_usable_and_says_why(
    tmp_path: Path, visible: str, problem: str
) -> None:
    view = gpu_view({"CUDA_VISIBLE_DEVICES": visible}, nodes(tmp_path, 2))
    assert view.visible == () and view.problem is not None and view.problem.startswith(problem)
    with pytest.raises(GpuRefused, match="the server has 0 usable") as refused:
        split_gpus(view, who="grpo-trl")
    assert f"CUDA_VISIBLE_DEVICES={visible!r} ({problem}" in str(refused.value)


def test_two_gpus_split_into_vllms_first_and_the_trainers_second(tmp_path: Path) -> None:
    view = gpu_view({}, nodes(tmp_path, 2))
    assert split_gpus(view) == GpuSplit(vllm=("0",), trainer=("1",))
    assert split_gpus(view).describe() == "vLLM on GPU 0, trainer on GPU 1"
    # The options choose among the usable ones, in either order.
    assert split_gpus(view, vllm=["1"], trainer=["0"]) == GpuSplit(("1",), ("0",))
    four = gpu_view({"CUDA_VISIBLE_DEVICES": "3,1,2"}, nodes(tmp_path, 4))
    assert split_gpus(four) == GpuSplit(("3",), ("1",))
    assert split_gpus(four, vllm=["1", "2"]) == GpuSplit(("1", "2"), ("3",))
    assert split_gpus(four, trainer=["3"]) == GpuSplit(("1",), ("3",))


@pytest.mark.parametrize("count", [0, 1])
def test_fewer_than_two_gpus_are_refused_naming_what_was_seen_and_what_is_needed(
    tmp_path: Path, count: int
) -> None:
    folder = nodes(tmp_path, count)
    with pytest.raises(GpuRefused) as refused:
        split_gpus(gpu_view({}, folder), who="grpo-trl")
    seen = "GPU 0" if count else "no GPU"
    listed = "nvidia0" if count else "none"
    assert str(refused.value) == (
        "grpo-trl needs 2 GPUs (1 for vLLM, 1 for the trainer, not shared); the server has "
        f"{count} usable ({seen}; device nodes in {folder}: {listed})"
    )


def test_the_documented_launch_of_old_is_refused_for_hiding_vllms_gpu(tmp_path: Path) -> None:
    """`CUDA_VISIBLE_DEVICES=1 tapdeck train --recipe grpo-trl` on a 2-GPU box: the launch may use
    GPU 1 only, and vLLM's GPU is one of the launch's too, so it is refused, saying so."""
    folder = nodes(tmp_path, 2)
    with pytest.raises(GpuRefused) as refused:
        split_gpus(gpu_view({"CUDA_VISIBLE_DEVICES": "1"}, folder), who="grpo-trl")
    assert str(refused.value).endswith(
        f"the server has 1 usable (GPU 1; device nodes in {folder}: nvidia0, nvidia1; "
        "CUDA_VISIBLE_DEVICES='1')"
    )


def test_options_outside_the_usable_gpus_or_shared_are_refused(tmp_path: Path) -> None:
    view = gpu_view({"CUDA_VISIBLE_DEVICES": "0,1"}, nodes(tmp_path, 3))
    outside = r"--trainer-gpus names GPU 2, but the server has 2 usable \(GPU 0, 1;"
    with pytest.raises(GpuRefused, match=outside):
        split_gpus(view, trainer=["2"])
    with pytest.raises(GpuRefused, match="GPU 0 is in both --vllm-gpus and --trainer-gpus"):
        split_gpus(view, vllm=["0"], trainer=["0"])
    with pytest.raises(GpuRefused, match=r"needs 3 GPUs \(2 for vLLM, 1 for the trainer"):
        split_gpus(view, vllm=["0", "1"])  # nothing left for the trainer


def test_gpu_options_parse_as_the_recipe_parser_does() -> None:
    assert gpu_list("0") == ["0"] and gpu_list("1, 03") == ["1", "3"]
    for bad in ("", "a", "0,,1", "0,0", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            gpu_list(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="one process and takes one GPU"):
        one_gpu("1,2")
    assert gpu_options(["--model", "m", "--vllm-gpus", "2,3", "--trainer-gpus=1"]) == (["2", "3"], ["1"])
    assert gpu_options([]) == (None, None)
    with pytest.raises(GpuRefused, match="not a list of GPU indices"):
        gpu_options(["--vllm-gpus", "all"])
    parsed = RECIPES["grpo-trl"].usage_error(["--trainer-gpus", "0,1"])
    assert parsed is not None and "one process and takes one GPU" in parsed


def test_the_grpo_trl_recipe_splits_by_the_rule(tmp_path: Path) -> None:
    view = gpu_view({}, nodes(tmp_path, 2))
    recipe = RECIPES["grpo-trl"]
    assert recipe.split_gpus(["--vllm-gpus", "1"], view) == GpuSplit(("1",), ("0",))
    assert RECIPES["cpu-grpo"].split_gpus([], view) is None
    env, argv = recipe.engine_command(
        ["--model", "/models/q", "--vllm-url", "http://localhost:8011", "--tool-call-parser", "qwen3_xml"],
        GpuSplit(("2", "3"), ("0",)),
    )
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3", "VLLM_SERVER_DEV_MODE": "1"}
    assert argv[:5] == ["vllm", "serve", "/models/q", "--host", "0.0.0.0"]
    assert argv[argv.index("--port") + 1] == "8011"
    assert argv[argv.index("--tool-call-parser") + 1] == "qwen3_xml"
    assert argv[-2:] == ["--tensor-parallel-size", "2"]
