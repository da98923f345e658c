"""An agent CLI that fails, as `tapdeck rollout` reports it: the failure's line under the table
names the phase it failed in (the agent's, though Harbor runs the verifier after it) and why, in
terms an operator can act on.

The real codex binary on the sample task through `tapdeck rollout`, against an engine answering
with vLLM 0.32's recorded bodies:
- a reply cut at max_tokens: codex ends such a turn with "Incomplete response returned, reason:
  max_output_tokens" and exits 1, as it did against the embedded engine; the line gives those
  words, not whatever its output's last 1,500 characters happened to start with;
- an engine that does not answer the agent's call within the agent timeout, as the embedded
  engine prefilling claude-code's 12k-token first prompt did not: the line says no call came back
  and names the flag that raises the limit.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.app.exit_codes import EXIT_ROLLOUT_FAILED
from tests.support.agent_clis import engine_for_agents, installed_or_skip
from tests.support.vllm_recordings import vllm_fixture, vllm_reply_to

pytestmark = pytest.mark.slow


def cut_at_max_tokens(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The agent's calls (those with tools) get the recorded reply cut by max_tokens; the session's
    engine probe gets the recorded plain reply."""
    recorded = "chat_length" if body.get("tools") else "chat_basic"
    return 200, vllm_reply_to(body, vllm_fixture(recorded)["response"])


def test_an_agent_cli_that_exits_non_zero_is_reported_in_its_phase_with_its_own_words(tmp_path: Path) -> None:
    installed_or_skip("codex")
    with engine_for_agents(cut_at_max_tokens) as engine:
        result = CliRunner().invoke(
            app,
            [
                "rollout",
                "--harness",
                "codex",
                "--task",
                "hello-file",
                "--engine",
                engine.base_url,
                "--harness-kwargs",
                json.dumps({"tool_profile": "lean"}),
                "--timeout",
                "300",
                "--data-dir",
                str(tmp_path / "data"),
            ],
            env={"COLUMNS": "80"},
        )
    assert engine.requests, result.output
    assert result.exit_code == EXIT_ROLLOUT_FAILED, result.output
    line = next((x for x in result.output.splitlines() if x.startswith("hello-file: ")), None)
    assert line == (
        "hello-file: NonZeroAgentExitCodeError during agent: codex exited with 1: "
        "ERROR: Incomplete response returned, reason: max_output_tokens"
    ), result.output


def test_an_agent_timeout_says_how_far_the_agent_got_and_how_to_give_it_longer(tmp_path: Path) -> None:
    installed_or_skip("codex")
    release = threading.Event()

    def never_in_time(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body.get("tools"):  # the agent's call: held past the agent timeout
            release.wait(300)
        return 200, vllm_reply_to(body, vllm_fixture("chat_basic")["response"])

    with engine_for_agents(never_in_time) as engine:
        try:
            result = CliRunner().invoke(
                app,
                [
                    "rollout",
                    "--harness",
                    "codex",
                    "--task",
                    "hello-file",
                    "--engine",
                    engine.base_url,
                    "--harness-kwargs",
                    json.dumps({"tool_profile": "lean"}),
                    "--agent-timeout",
                    "5",
                    "--data-dir",
                    str(tmp_path / "data"),
                ],
                env={"COLUMNS": "80"},
            )
        finally:
            release.set()
    assert any(r.get("tools") for r in engine.requests), result.output
    assert result.exit_code == EXIT_ROLLOUT_FAILED, result.output
    assert "agent_timeout" in result.output
    line = next((x for x in result.output.splitlines() if x.startswith("hello-file: ")), None)
    assert line == (
        "hello-file: AgentTimeoutError during agent: Agent execution timed out after "
        "5.0 seconds, before any model call came back; --agent-timeout raises it"
    ), result.output
