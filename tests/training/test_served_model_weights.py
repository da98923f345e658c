"""The engine serves the F16 re-encoding of the shipped Q4_1 GGUF; the trainer dequantises that
file to the same weights as the shipped one (to within F16 rounding), so the rescored and trained
weights are those the engine sampled from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_in_train_env

SCRIPT = Path(__file__).parent / "train_env_scripts" / "gguf_weights.py"


@pytest.mark.slow
def test_trainer_loads_the_served_f16_file_to_the_shipped_weights(train_python: Path) -> None:
    from tapdeck.runner.engine.model_file import default_model_path, shipped_model_path

    out = json.loads(run_in_train_env(train_python, SCRIPT, str(shipped_model_path()),
                                      str(default_model_path())).splitlines()[-1])
    assert out["only_in_one"] == [] and out["shape_differs"] == []
    assert len(out["excess"]) > 200  # every layer's tensors were compared
    assert max(out["excess"].values()) <= 0, {k: v for k, v in out["excess"].items() if v > 0}
