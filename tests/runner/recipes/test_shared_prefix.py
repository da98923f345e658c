"""cpu-grpo's trainer scores a group's shared prompt once (`recipes/shared_prefix.py`): the same
logprobs, entropies and gradients as TRL's own pass over every row whole, checked in the training
environment against TRL 1.16's `_get_per_token_logps_and_entropies` on a small seeded Llama with
TRL's fused LM head (two groups, left-padded prompts, right-padded completions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.in_train_env import TRAIN_ENV_SCRIPTS, run_in_train_env

pytestmark = pytest.mark.slow  # imports torch and TRL in the training environment (tens of seconds)


def test_the_shared_prompt_pass_gives_trls_logprobs_entropies_and_gradients(train_python: Path) -> None:
    found = json.loads(run_in_train_env(train_python, TRAIN_ENV_SCRIPTS / "shared_prefix_check.py"))
    print(f"\n{found}")
    assert found["shape"] == [[6, 7], [6, 7]]
    # float32 in another order of summation: rounding, far below the values themselves.
    assert found["logps_max_diff"] < 1e-4 * max(1.0, found["logps_max"])
    assert found["entropy_max_diff"] < 1e-4 * max(1.0, found["entropy_max"])
    assert found["grad_max_diff"] < 1e-4 * max(1.0, found["grad_max"])
    # Rows whose prompt another row does not share take TRL's own path.
    assert found["unshared_rows"] is True
