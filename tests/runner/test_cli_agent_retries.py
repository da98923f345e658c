"""What tapdeck's configuration of the agent CLIs does to a failed model call and to start-up.

Measured against a proxy that answers every call with a 502 (a dead engine): each setting below cut
requests or seconds there; tests/runner/test_agent_rollouts.py's dead-engine test runs the binaries.
"""

from __future__ import annotations

import json
from pathlib import Path

from tapdeck.runner.cli_agents import RETRIES, MiniSweAgentCli, QwenCodeCli


def _agent(cls: type, tmp_path: Path):
    agent = cls(tmp_path, "smollm2", proxy_url="http://127.0.0.1:1/v1", session_key="k")
    agent.entry = tmp_path / "bin" / agent.name()
    return agent


def test_mini_swe_agent_retries_only_by_its_own_attempts(tmp_path: Path) -> None:
    agent = _agent(MiniSweAgentCli, tmp_path)
    assert agent.env()["MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT"] == str(RETRIES + 1)
    # The OpenAI client under litellm retries twice by default inside each of those attempts.
    assert "model.model_kwargs.max_retries=0" in agent.command("do it")


def test_mini_swe_agent_exits_on_an_error_with_a_plain_traceback(tmp_path: Path) -> None:
    assert _agent(MiniSweAgentCli, tmp_path).env()["TYPER_STANDARD_TRACEBACK"] == "1"


def test_qwen_code_starts_without_relaunching_itself(tmp_path: Path) -> None:
    assert _agent(QwenCodeCli, tmp_path).env()["QWEN_CODE_NO_RELAUNCH"] == "true"


def test_qwen_code_openai_client_does_not_retry_under_its_own_retry_loop(tmp_path: Path) -> None:
    settings = json.loads(_agent(QwenCodeCli, tmp_path).config_files()[".qwen/settings.json"])
    assert settings["model"]["generationConfig"]["maxRetries"] == 0
