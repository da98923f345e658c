"""Which GPUs a GPU recipe's launch gets: one rule for `tapdeck train`, the server's train route and
the Train screen (they all launch through the server, which applies it).

The rule: the GPUs a launch may use are the server's `/dev/nvidiaN` device nodes, narrowed by the
server's `CUDA_VISIBLE_DEVICES` when it is set (a list of those indices; empty hides them all).
vLLM's GPUs and the trainer's are taken from them, disjoint: `--vllm-gpus` (default: the first) and
`--trainer-gpus` (default: the first one after vLLM's); one given, the other defaults to the
first usable one it leaves. The trainer's process runs with
`CUDA_VISIBLE_DEVICES` set to its own GPU only; vLLM, which the operator starts, is given the
command with `CUDA_VISIBLE_DEVICES` set to its GPUs. So a box with GPUs 0 and 1 gives vLLM 0 and the
trainer 1, and `CUDA_VISIBLE_DEVICES=1` leaves the launch one GPU, which is refused.

Indices are read as CUDA reads them when `CUDA_DEVICE_ORDER=PCI_BUS_ID` (the order of the device
nodes); GPU UUIDs are refused rather than guessed at. Read from device nodes, so that asking never
imports torch; the folder is `$TAPDECK_DEV_DIR` when set (tests give a folder of fake nodes), else
/dev.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

ENV = "CUDA_VISIBLE_DEVICES"
DEV_DIR_ENV = "TAPDECK_DEV_DIR"
"""Where the device nodes are read, when not /dev (tests: a folder of fake ones)."""


class GpuRefused(ValueError):
    """The launch cannot have the GPUs it needs; the message says what was seen and what is needed."""


@dataclass(frozen=True)
class GpuView:
    """The GPUs a launch may use, and where that was read from."""

    nodes: tuple[str, ...]
    """Indices of the `/dev/nvidiaN` nodes, in order."""
    dev_dir: Path
    env: str | None
    """`CUDA_VISIBLE_DEVICES` as set (None: unset)."""
    visible: tuple[str, ...]
    """The indices a launch may use."""
    problem: str | None = None
    """Why `CUDA_VISIBLE_DEVICES` cannot be read as a list of those indices (then nothing is visible)."""

    def seen(self) -> str:
        """What was seen, from where, in words."""
        nodes = ", ".join(f"nvidia{n}" for n in self.nodes) or "none"
        where = f"device nodes in {self.dev_dir}: {nodes}"
        if self.env is not None:
            where += f"; {ENV}={self.env!r}"
            if self.problem:
                where += f" ({self.problem})"
        count = len(self.visible)
        gpus = f"GPU {', '.join(self.visible)}" if self.visible else "no GPU"
        return f"{count} usable ({gpus}; {where})"


def gpu_view(env: Mapping[str, str] | None = None, dev_dir: Path | None = None) -> GpuView:
    """The server's usable GPUs: device nodes in `dev_dir` (default `$TAPDECK_DEV_DIR`, else /dev),
    narrowed by `CUDA_VISIBLE_DEVICES` in `env` (default this process's environment)."""
    env = os.environ if env is None else env
    folder = dev_dir or Path(env.get(DEV_DIR_ENV) or "/dev")
    try:
        names = [p.name[len("nvidia") :] for p in folder.glob("nvidia*")]
    except OSError:
        names = []
    nodes = tuple(str(n) for n in sorted(int(s) for s in names if s.isdigit()))
    raw = env.get(ENV)
    if raw is None:
        return GpuView(nodes, folder, None, nodes)
    entries = [e for e in (x.strip() for x in raw.split(",")) if e]  # "0," reads as 0, as in CUDA
    problem = None
    if bad := [e for e in entries if not e.isdigit()]:
        problem = f"{bad[0]!r} is not a GPU index; tapdeck splits GPUs by index"
    elif missing := [e for e in entries if str(int(e)) not in nodes]:
        problem = f"no device node nvidia{int(missing[0])}"
    elif len({int(e) for e in entries}) < len(entries):
        problem = "a GPU is named twice"
    if problem:
        return GpuView(nodes, folder, raw, (), problem)
    return GpuView(nodes, folder, raw, tuple(str(int(e)) for e in entries))


@dataclass(frozen=True)
class GpuSplit:
    """vLLM's GPUs and the trainer's, disjoint."""

    vllm: tuple[str, ...]
    trainer: tuple[str, ...]

    def describe(self) -> str:
        """`vLLM on GPU 0, trainer on GPU 1`."""
        return f"vLLM on GPU {','.join(self.vllm)}, trainer on GPU {','.join(self.trainer)}"


def split_gpus(
    view: GpuView,
    *,
    vllm: Sequence[str] | None = None,
    trainer: Sequence[str] | None = None,
    who: str = "",
) -> GpuSplit:
    """vLLM's and the trainer's GPUs by the rule (module doc), or GpuRefused saying what was seen
    (`view`) and what is needed. `who` names the recipe in the message."""
    n_vllm, n_trainer = len(vllm) if vllm else 1, len(trainer) if trainer else 1
    needs = (
        f"{who or 'it'} needs {n_vllm + n_trainer} GPUs ({n_vllm} for vLLM, {n_trainer} for the "
        "trainer, not shared)"
    )
    for role, asked in (("--vllm-gpus", vllm), ("--trainer-gpus", trainer)):
        if asked and (outside := [g for g in asked if g not in view.visible]):
            raise GpuRefused(f"{needs}; {role} names GPU {outside[0]}, but the server has {view.seen()}")
    if vllm and trainer and (both := [g for g in vllm if g in trainer]):
        raise GpuRefused(f"{needs}; GPU {both[0]} is in both --vllm-gpus and --trainer-gpus")
    engine = tuple(vllm) if vllm else tuple([g for g in view.visible if g not in (trainer or ())][:1])
    rest = [g for g in view.visible if g not in engine]
    train = tuple(trainer) if trainer else tuple(rest[:1])
    if not engine or not train:
        raise GpuRefused(f"{needs}; the server has {view.seen()}")
    return GpuSplit(engine, train)


def gpu_list(text: str) -> list[str]:
    """An argparse type: GPU indices, comma-separated (`0`, `0,1`)."""
    entries = [e.strip() for e in text.split(",")]
    if not entries or not all(e.isdigit() for e in entries):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of GPU indices (e.g. 0 or 0,1)")
    if len(set(map(int, entries))) < len(entries):
        raise argparse.ArgumentTypeError(f"{text!r} names a GPU twice")
    return [str(int(e)) for e in entries]


def one_gpu(text: str) -> list[str]:
    """An argparse type: one GPU index (the trainer is one process, on one GPU)."""
    gpus = gpu_list(text)
    if len(gpus) != 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the trainer is one process and takes one GPU")
    return gpus


def add_gpu_options(parser: argparse.ArgumentParser) -> None:
    """`--vllm-gpus` and `--trainer-gpus`, as a GPU recipe's parser and `gpu_options` read them."""
    parser.add_argument(
        "--vllm-gpus",
        type=gpu_list,
        default=None,
        help="GPUs of the vLLM server the trainer syncs into, e.g. 0 or 0,1 (default: the first "
        f"the server sees: its device nodes, narrowed by its {ENV})",
    )
    parser.add_argument(
        "--trainer-gpus",
        type=one_gpu,
        default=None,
        help=f"The trainer's GPU (default: the first after vLLM's); its process gets {ENV} = it",
    )


def gpu_options(args: Sequence[str]) -> tuple[list[str] | None, list[str] | None]:
    """`--vllm-gpus` and `--trainer-gpus` as recipe args give them (None: not given). GpuRefused
    for a value that is no list of indices."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_gpu_options(parser)

    def refuse(message: str) -> NoReturn:
        raise GpuRefused(message)

    # Not argparse's own error(), which exits: this runs inside a server.
    parser.error = refuse  # type: ignore[method-assign]
    known, _ = parser.parse_known_args(list(args))
    return known.vllm_gpus, known.trainer_gpus
