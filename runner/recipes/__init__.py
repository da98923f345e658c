"""Training recipes the launcher can start, and where each one can actually run.

A recipe is a Python module run as `python -m <module> [args…]` in its own process (its own
process group), with `TRACKIO_DIR` pointed at the run's directory; it logs its metrics to trackio.
Recipes that need torch and TRL run in the training environment (`env="train"`: Python 3.11 with
CPU torch, made by scripts/train-env.sh), the others in the server's own interpreter.

`data-check` checks an exported run against what TRL's trainer requires and computes the GRPO
advantages a trainer would use; it does not train. `cpu-grpo` really trains SmolLM2-135M on this
kind of CPU machine (TRL's GRPOTrainer, rollouts by tapdeck, sampled from the weights being
trained). `grpo-trl` trains with TRL AsyncGRPO + vLLM and needs a GPU box.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from tapdeck.runner.recipes.gpu_split import GpuSplit, GpuView, gpu_options, gpu_view, split_gpus
from tapdeck.schema.train import rows_missing


class _UsageError(Exception):
    """A recipe's argument parser refused its args."""


@dataclass(frozen=True)
class Recipe:
    """One launchable recipe."""

    name: str
    module: str
    """Run as `python -m module`."""
    summary: str
    where: str
    """Where it can run, in words ("CPU, here", "GPU box with vLLM")."""
    updates_weights: bool
    needs: tuple[str, ...] = field(default=())
    """Python modules the recipe process imports (checked with `find_spec`, never imported here)."""
    env: str = "server"
    """"server": the server's own interpreter; "train": the training environment (torch, TRL)."""
    takes_run: bool = False
    """It reads a rollout run's exported rows (`--rows`), exported by the server that launches it."""
    rows_options: tuple[str, ...] = field(default=())
    """Its own options that name the rows it reads instead (`--rows PATH`), given as recipe args.
    A recipe that takes a run and has these must be given `--run` or one of them."""
    run_option: bool = False
    """Its own `--run RUN` reads a rollout run itself (grpo-trl: that run's dataset, tasks and
    harness), so a launch's run is passed to it as `--run`. A recipe that neither takes a run nor has this
    option is given no run."""
    gpu_split: bool = False
    """It trains on a GPU beside a vLLM server on others: a launch's GPUs are split by the rule of
    `tapdeck.runner.recipes.gpu_split` (its module has `engine_command`, vLLM's command line)."""

    def missing(self) -> list[str]:
        """Required modules not installed in this interpreter (empty = it can start here).

        A recipe of the training environment is checked there by its launcher instead."""
        if self.env == "train":
            return []
        return [m for m in self.needs if importlib.util.find_spec(m) is None]

    def split_gpus(self, args: Sequence[str] = (), view: GpuView | None = None) -> GpuSplit | None:
        """vLLM's and the trainer's GPUs for a launch with these recipe args, from the GPUs `view`
        (default: the ones this process sees); None for a recipe that uses none. GpuRefused saying
        what was seen and what is needed."""
        if not self.gpu_split:
            return None
        vllm, trainer = gpu_options(args)
        return split_gpus(view or gpu_view(), vllm=vllm, trainer=trainer, who=self.name)

    def engine_command(self, args: Sequence[str], split: GpuSplit) -> tuple[dict[str, str], list[str]]:
        """The environment and command line of the vLLM server a GPU recipe trains beside, on its
        GPUs of `split` (the operator starts it; tapdeck does not)."""
        module = importlib.import_module(self.module)
        return module.engine_command(list(args), list(split.vllm))  # type: ignore[no-any-return]

    def rows_missing(self, run: str | None, args: Sequence[str]) -> str | None:
        """Why a launch with `run` and these recipe args is certain to fail at its argument parser
        (the rows it reads named nowhere), or None."""
        return rows_missing(self.name, self.takes_run, self.rows_options, run, args)

    def usage_error(self, args: Sequence[str], *, run: str | None = None) -> str | None:
        """What the recipe's own argument parser says of these args (its `error:` line), or None
        when it takes them, launched with the rollout run `run`. Asked before a job starts, so
        that a typo is refused in one line rather than by a job dying of its usage message.
        `--help` is left to the job to print."""
        if any(a in ("-h", "--help") for a in args):
            return None
        if why := self.source_conflict(run, args):
            return why
        # The args as the job would get them; an existing file stands for the run's export the
        # launch makes, as the parser refuses rows that are not there.
        given = ["--rows", os.devnull] if self.takes_run and run else ["--run", run] if run else []
        parser = importlib.import_module(self.module).arg_parser()

        def refuse(message: str) -> NoReturn:
            raise _UsageError(message)

        # Not argparse's own error(), which prints to stderr and exits: this runs inside a server.
        parser.error = refuse  # type: ignore[method-assign]
        try:
            parser.parse_args([*given, *args])
        except _UsageError as exc:
            return f"{self.name}: {exc} (its options: tapdeck train --recipe {self.name} -- --help)"
        return None

    def source_conflict(self, run: str | None, args: Sequence[str]) -> str | None:
        """Why recipe args name what the launch's rollout run `run` names (the rows to read, the
        run), or None. The job's parser keeps the last of them, so one would silently replace
        the other; and a recipe's own `--run` reads only an export already written, where the
        launch's has the server export the run's rows."""
        own_run = _option_value(args, "--run")
        if self.takes_run:
            rows = next(
                (
                    (o, v)
                    for o in (r.split()[0] for r in self.rows_options)
                    if (v := _option_value(args, o)) is not None
                ),
                None,
            )
            if run and rows:
                return (
                    f"{self.name}: --run {run} and {rows[0]} {rows[1]} both name the rows to "
                    f"read: give one (--run: the server exports that run's rows; {rows[0]}: "
                    "an export file on the server's machine)"
                )
            if own_run is not None and rows is None:
                if run:
                    return (
                        f"{self.name}: --run {run} and its own --run {own_run} both name the "
                        "run: give it once, as --run before -- (the server exports its rows)"
                    )
                return (
                    f"{self.name}: give the run as --run {own_run} before -- (the Train "
                    f"screen: pick it), not as {self.name}'s own --run, which reads only an "
                    "export already written"
                )
        elif self.run_option and run and own_run is not None:
            return f"{self.name}: --run {run} and its own --run {own_run} both name the run: give it once"
        return None

    def run_refused(self, run: str | None) -> str | None:
        """Why a launch given the rollout run `run` cannot use it, or None: the recipe reads no
        run, so its argument parser would only die of an unknown `--run`."""
        if run is None or self.takes_run or self.run_option:
            return None
        return (
            f"{self.name} takes no rollout run (--run {run}): it makes its own rollouts "
            f"(its options: tapdeck train --recipe {self.name} -- --help)"
        )


def _option_value(args: Sequence[str], option: str) -> str | None:
    """The value `args` give `option` (`--opt V` or `--opt=V`; the last one, as argparse keeps;
    "" for one given no value), or None when it is not among them."""
    value = None
    for i, arg in enumerate(args):
        if arg == option:
            value = args[i + 1] if i + 1 < len(args) else ""
        elif arg.startswith(option + "="):
            value = arg[len(option) + 1 :]
    return value


RECIPES: dict[str, Recipe] = {
    "data-check": Recipe(
        name="data-check",
        module="tapdeck.runner.recipes.data_check",
        summary=(
            "Checks an exported run against TRL's trainer contract and computes GRPO advantages "
            "per group; logs TRL-named metrics to trackio. Does NOT update weights."
        ),
        where="CPU, here (no GPU, no torch)",
        updates_weights=False,
        needs=("trackio",),
        takes_run=True,
        rows_options=("--rows PATH",),
    ),
    "cpu-grpo": Recipe(
        name="cpu-grpo",
        module="tapdeck.runner.recipes.cpu_grpo",
        summary=(
            "TRL GRPOTrainer on SmolLM2-135M (from the shipped GGUF) with rollout_func: each "
            "group is a tapdeck run on the sample dataset, sampled by an engine serving the "
            "trainer's current weights; updates weights. Minutes per step on 2 cores."
        ),
        where="CPU, here (training environment: CPU torch + TRL)",
        updates_weights=True,
        needs=("torch", "transformers", "trl", "trackio", "gguf"),
        env="train",
    ),
    "grpo-trl": Recipe(
        name="grpo-trl",
        module="tapdeck.runner.recipes.grpo_trl",
        summary=(
            "TRL AsyncGRPO (loop-owning harness worker) on rollouts served by a tapdeck server; "
            "updates weights. Not run on this machine."
        ),
        where=(
            "GPU box: vLLM on one GPU (NCCL weight sync), the trainer on another "
            "(--vllm-gpus/--trainer-gpus: default the first two the server sees)"
        ),
        updates_weights=True,
        needs=("torch", "trl", "openenv", "trackio"),
        env="train",
        run_option=True,
        gpu_split=True,
    ),
}

DEFAULT_RECIPE = "data-check"
CPU_TRAINING = (
    "cpu-grpo updates SmolLM2-135M's weights on a CPU (slowly: minutes per step on "
    "2 cores); the embedded llama.cpp engine cannot train, so that recipe samples from "
    "its own torch copy of the model."
)


def get_recipe(name: str) -> Recipe:
    """The recipe called `name`, or a ValueError naming the known ones."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}") from None
