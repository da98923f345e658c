"""Training tests: export rows built from recorded vLLM turns, and a scratch data dir.

The rows are produced by the real `tapdeck.proxy.export` functions (RolloutGraph → trace_rows →
write_jsonl) from Turns built out of tests/fixtures/vllm bodies, exactly as `tapdeck export RUN` does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proxy_core"))
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def export_file(tmp_path: Path) -> Path:
    """An export JSONL of three groups (see training_data.ROLLOUTS)."""
    from training_data import write_export

    return write_export(tmp_path / "exports" / "r-test.jsonl")
