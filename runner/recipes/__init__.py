"""Training recipes the launcher can start, and where each one can actually run.

A recipe is a Python module run as `python -m <module> [args…]` in its own process (its own
process group), with `TRACKIO_DIR` pointed at the run's directory; it logs its metrics to trackio.

Plainly: **no recipe that runs on this kind of CPU machine updates the model's weights.**
llama.cpp (the embedded engine) can only run inference, and torch for Python 3.12 is a multi-GB
CUDA download that the CPU boxes here do not carry. `data-check` really runs anywhere: it checks an
exported run against what TRL's trainer requires and computes the GRPO advantages a trainer would
use, step by step — it does not train. `grpo-trl` trains (TRL AsyncGRPO + vLLM) and needs a GPU box.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field


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

    def missing(self) -> list[str]:
        """Required modules not installed in this interpreter (empty = it can start here)."""
        return [m for m in self.needs if importlib.util.find_spec(m) is None]


RECIPES: dict[str, Recipe] = {
    "data-check": Recipe(
        name="data-check",
        module="tapdeck.runner.recipes.data_check",
        summary=("Checks an exported run against TRL's trainer contract and computes GRPO advantages "
                 "per group; logs TRL-named metrics to trackio. Does NOT update weights."),
        where="CPU, here (no GPU, no torch)",
        updates_weights=False,
        needs=("trackio",),
    ),
    "grpo-trl": Recipe(
        name="grpo-trl",
        module="tapdeck.runner.recipes.grpo_trl",
        summary=("TRL AsyncGRPO (loop-owning harness worker) on rollouts served by a tapdeck server; "
                 "updates weights. Not run on this machine."),
        where="GPU box: vLLM on one GPU (NCCL weight sync), the trainer on another",
        updates_weights=True,
        needs=("torch", "trl", "openenv", "trackio"),
    ),
}

DEFAULT_RECIPE = "data-check"
NO_CPU_TRAINING = ("No recipe that runs on a CPU machine here updates the model's weights: llama.cpp "
                   "cannot train, and torch for Python 3.12 would be a multi-GB CUDA download.")


def get_recipe(name: str) -> Recipe:
    """The recipe called `name`, or a ValueError naming the known ones."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}") from None
