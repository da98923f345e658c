"""The training environment (scripts/train-env.sh): pinned, idempotent, and able to run tapdeck's recipes.

Recipes there import tapdeck's 3.11-clean modules through a PYTHONPATH link (`training.package_path`):
the recipes and the schema, never tapdeck's proxy, app or Harbor code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tapdeck
from tapdeck.runner.train_env import ensure_python
from tapdeck.runner.training import package_path
from tests.support.in_train_env import TRAIN_ENV_SCRIPTS, run_in_train_env

SCRIPT = TRAIN_ENV_SCRIPTS / "recipe_imports.py"


@pytest.mark.slow  # the fixture makes the environment on a fresh machine (minutes)
def test_making_the_environment_twice_reuses_it(train_python: Path) -> None:
    assert ensure_python() == train_python
    assert (train_python.parent.parent / ".tapdeck-train-env").is_file()


def test_the_pythonpath_link_a_recipe_gets_holds_only_this_checkout_as_tapdeck(tmp_path: Path) -> None:
    folder = package_path(tmp_path)
    assert [p.name for p in Path(folder).iterdir()] == ["tapdeck"]
    assert (Path(folder) / "tapdeck").resolve() == Path(tapdeck.__file__).resolve().parent


@pytest.mark.slow  # imports torch and TRL in the training environment
def test_recipe_modules_and_the_training_stack_import_in_the_training_environment(train_python: Path) -> None:
    found = json.loads(run_in_train_env(train_python, SCRIPT))
    assert found["python"] == [3, 11]
    assert found["torch"].startswith("2.13.0") and found["cuda"] is None  # the CPU build
    assert found["versions"] == {
        "trl": "1.16.0",
        "openenv": "0.10.0",
        "transformers": "5.18.0",
        "trackio": "0.43.0",
        "gguf": "0.19.0",
    }
    assert found["stack"] == [
        "AsyncGRPOConfig",
        "AsyncGRPOTrainer",
        "AutoTokenizer",
        "Dataset",
        "GenerationConfig",
        "HarnessRolloutWorker",
    ]
    # The recipes build the run plan from the schema (pydantic only) and write their files through
    # the store's standard-library writers (never through a link); never the proxy's server, the
    # app or Harbor.
    assert found["tapdeck_modules"] == [
        "tapdeck",
        "tapdeck.proxy",
        "tapdeck.proxy.store",
        "tapdeck.proxy.store.atomic_write",
        "tapdeck.proxy.store.no_follow",
        "tapdeck.runner",
        "tapdeck.runner.recipes",
        "tapdeck.runner.recipes.admin_client",
        "tapdeck.runner.recipes.data_check",
        "tapdeck.runner.recipes.gpu_split",
        "tapdeck.runner.recipes.grpo_trl",
        "tapdeck.schema",
        "tapdeck.schema.addresses",
        "tapdeck.schema.findings",
        "tapdeck.schema.rollout_health",
        "tapdeck.schema.runs",
        "tapdeck.schema.settings",
        "tapdeck.schema.tls",
        "tapdeck.schema.train",
    ]
