"""The real agent binaries against a tapdeck that refuses their call (HTTP 400), in front of an
engine answering with vLLM 0.32's recorded error body: the agent sees what was refused and gives up
after a bounded number of tries.

claude-code answers a 400 by retrying with fewer features (shared/reference/harness-clis.md: 6
requests, dropping betas, `thinking.display`, then tool search); here it must stop on its own and
print the refusal's own words. Runs in seconds: the engine is the recorded one, no prefill.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from tapdeck.runner import agent_install  # noqa: E402
from tapdeck.runner.cli_agents import AGENT_ROOT, CLI_AGENTS  # noqa: E402
from tests.agents.test_agent_rollouts import installed_or_skip  # noqa: E402
from tests.conftest import vllm_fixture  # noqa: E402
from tests.dialects.conftest import (  # noqa: E402,F401  (fixtures)
    CaptureServer,
    ScriptedUpstream,
    capture,
    scripted,
    upstream,
)

pytestmark = pytest.mark.slow


def recorded_400() -> dict[str, Any]:
    """vLLM 0.32's own 400 body for a request it refuses (it names the parameter)."""
    cases = {c["case"]: c for c in vllm_fixture("errors")["cases"]}
    return cases["stream_options_without_stream"]["body"]


def run_cli(name: str, info: dict[str, Any], root: Path, instruction: str,
            timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    """Run the installed CLI once as tapdeck's Harbor agent would, with its per-trial folders
    under `root` instead of the sandbox's `/installed-agent`."""
    cls = CLI_AGENTS[name]
    dialect_url = {"claude-code": "anthropic", "gemini-cli": "google"}.get(name, "openai")
    agent = cls(logs_dir=root / "logs", model_name="smollm2",
                proxy_url=info["base_urls"][dialect_url], session_key=info["api_key"])
    agent.entry = agent_install.entry_path(name)
    assert agent.entry is not None
    env = {k: v.replace(AGENT_ROOT, str(root)) for k, v in agent.env().items()}
    for relative, text in agent.config_files().items():
        path = Path(env["HOME"]) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in (env["HOME"], env["TMPDIR"]):
        Path(folder).mkdir(parents=True, exist_ok=True)
    work = root / "work"
    work.mkdir()
    env["PATH"] = os.environ["PATH"]
    return subprocess.run(["bash", "-c", agent.command(instruction)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)


def test_claude_code_gives_up_on_a_400_and_prints_what_was_refused(
        capture: CaptureServer, upstream: ScriptedUpstream, tmp_path: Path) -> None:
    installed_or_skip("claude-code")
    refusal = recorded_400()
    upstream.answer = lambda body: (400, refusal)
    info = capture.open_session()
    started = time.monotonic()
    done = run_cli("claude-code", info, tmp_path, "create hello.txt containing hi")
    wall = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    # The refusal's own words reach the operator through the agent.
    assert "Stream options can only be defined" in output, output
    # Its model check ("Name one prime number.", no tools), then the task call retried with fewer
    # features each time (tool search off: its deferred tools come inline), then it stops.
    tools = [len(r.get("tools") or []) for r in upstream.requests]
    main = [n for n in tools if n]
    print(f"\nclaude-code against a 400: {len(tools)} requests in {wall:.1f} s, tools per request "
          f"{tools}, exit {done.returncode}")
    assert len(tools) - len(main) <= 2, tools
    assert 2 <= len(main) <= 8 and main[-1] > main[0], tools
    assert not (tmp_path / "work" / "hello.txt").exists()
    assert capture.summary(info["id"])["turns"] == 0
