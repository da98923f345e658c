"""The newcomer's path: `tapdeck rollout` with no flags (sample dataset, terminus-2, host sandbox,
embedded engine) reaches a graded rollout that ended by the agent's own turn budget or completion,
not by a timeout, with terminus-2's defaults on the embedded engine. How long it took on this
machine kind is in the README, not asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tapdeck.runner.rollout_settings import HARNESS_DEFAULTS

pytestmark = pytest.mark.slow

TAPDECK = Path(sys.executable).with_name("tapdeck")


def test_default_rollout_is_graded_and_ends_by_its_turn_budget(tmp_path: Path) -> None:
    """About 25 s alone, over 120 s when the suite's other engine tests share the 2 cores (174 s
    on 3 workers, 2026-12-07): it is the README's first rollout as it stands, so the defaults
    (terminus-2's nine calls of up to 128 tokens on the embedded engine) are its size."""
    pytest.importorskip("llama_cpp", reason="the embedded engine needs llama-cpp-python")
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.run(
        [str(TAPDECK), "rollout", "--data-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run_dir] = (tmp_path / "runs").iterdir()
    [result] = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert result["error_kind"] is None, (result["error"], result["findings"])
    assert result["ok"] and result["reward"] is not None  # graded (0.0: the small model never solves)
    assert result["turns"] >= 1 and result["tier"] == "tokens"
    # What it ran with, taken from the engine and the task, each value with its source.
    settings = result["settings"]
    assert (settings["context_tokens"], settings["context_source"]) == (32768, "engine")
    # terminus-2's row of the embedded engine's defaults: the sample task's 180 s gives way to
    # the time its nine calls (3 a turn, each re-asked after a cut) take at the measured rates.
    row = HARNESS_DEFAULTS["terminus-2"]
    agent = row.embedded_agent_timeout_s(max_turns=3, tool_profile=None, output_tokens=128)
    assert agent > 180.0
    assert (settings["max_output_tokens"], settings["max_output_source"]) == (128, "harness-default")
    assert (settings["agent_timeout_s"], settings["agent_timeout_source"]) == (agent, "harness-default")
    assert (settings["hard_limit_s"], settings["hard_limit_source"]) == (agent + 120, "default")
    assert (
        f"ran with: agent {agent:g} s (harness-default) · hard limit {agent + 120:g} s (default)"
    ) in proc.stdout
