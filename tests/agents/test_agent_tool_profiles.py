"""The `lean` tool profile: each real agent binary, set through its own documented settings, sends
only the tools a coding task needs (shell, edit, write, read), still runs its own tool loop, and
its first prompt, rendered with the embedded engine's template and tokenizer, is smaller than with
its full tool set (the figure measured here, `FIRST_PROMPT_TOKENS`).

Against recorded vLLM replies, as test_agent_binaries: seconds per agent, no prefill.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from tapdeck.runner.cli_agents import CLI_AGENTS  # noqa: E402
from tapdeck.runner.rollout_settings import FIRST_PROMPT_TOKENS  # noqa: E402
from tests.agents.test_agent_binaries import run_cli, scripted_agent_reply  # noqa: E402
from tests.agents.test_agent_rollouts import installed_or_skip  # noqa: E402
from tests.dialects.conftest import (  # noqa: E402,F401  (fixtures)
    CaptureServer,
    ScriptedUpstream,
    capture,
    scripted,
    upstream,
)

pytestmark = pytest.mark.slow

LEAN_AGENTS = [n for n, cls in CLI_AGENTS.items() if cls.LEAN_TOOLS]
"""mini-swe-agent has one tool (bash) and a 1k-token prompt: nothing to shrink."""


@cache
def _engine_text_model() -> tuple[Any, Any]:
    pytest.importorskip("llama_cpp", reason="the engine's tokenizer needs llama-cpp-python")
    from tapdeck.runner.engine.model import LlamaModel, default_model_path
    from tapdeck.runner.engine.template import ChatTemplate

    model = LlamaModel(default_model_path(), n_ctx=512)
    return model, ChatTemplate(model.chat_template)


def prompt_parts(body: dict[str, Any]) -> dict[str, int]:
    """Tokens of a chat request as the embedded engine renders it: the whole prompt, the tools'
    share (with minus without them) and the system messages' share."""
    model, template = _engine_text_model()

    def count(messages: list[dict[str, Any]], tools: Any = None, gen: bool = True) -> int:
        return len(model.tokenize(template.render(messages, tools=tools,
                                                  add_generation_prompt=gen)))

    messages = body["messages"]
    total = count(messages, body.get("tools"))
    bare = count(messages)
    system = count([m for m in messages if m["role"] == "system"], gen=False)
    return {"total": total, "tools": total - bare, "system": system, "rest": bare - system}


@pytest.mark.parametrize("name", LEAN_AGENTS)
def test_lean_profile_sends_only_the_task_tools_and_keeps_the_agents_loop(
        capture: CaptureServer, upstream: ScriptedUpstream, tmp_path: Path, name: str) -> None:
    installed_or_skip(name)
    upstream.answer = scripted_agent_reply(name)
    info = capture.open_session()
    done = run_cli(name, info, tmp_path, "Create a file hello.txt containing hi.",
                   tool_profile="lean")
    output = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, output
    # Its own loop still ran the shell tool and got to the file.
    assert (tmp_path / "work" / "hello.txt").read_text().strip() == "hi", output
    first = next(r for r in upstream.requests if r.get("tools"))
    sent = {t["function"]["name"] for t in first["tools"]}
    assert sent == set(CLI_AGENTS[name].LEAN_TOOLS), sent
    parts = prompt_parts(first)
    print(f"\n{name} lean first prompt: {parts} (full: {FIRST_PROMPT_TOKENS[name]})")
    assert parts["total"] < FIRST_PROMPT_TOKENS[name], parts
