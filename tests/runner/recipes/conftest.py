"""Fixtures for the recipes' tests: export rows built from recorded vLLM turns.

The rows are produced by the real `tapdeck.proxy.capture.export` functions (RolloutGraph →
trace_rows → write_jsonl) from Turns built out of tests/fixtures/vllm bodies, exactly as
`tapdeck export RUN` does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.training_export import write_export


@pytest.fixture
def export_file(tmp_path: Path) -> Path:
    """An export JSONL of three groups (see tests.support.training_export.ROLLOUTS)."""
    return write_export(tmp_path / "exports" / "r-test.jsonl")
