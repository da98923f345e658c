"""The real agent CLIs as tests run them: installed (or the test skipped), and the replies a
capable model would give them."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests.support.fake_vllm import Answer, FakeVllm, vllm_listing
from tests.support.vllm_recordings import vllm_fixture, vllm_reply_to

AGENT_CONTEXT = 32768
"""The agents' first prompts are 8-17k tokens: more than SmolLM2's trained 8,192."""


def installed_or_skip(name: str) -> None:
    """Install the pinned CLI (cached after the first time); skip only if the registry is down."""
    from tapdeck.runner import agent_install

    try:
        agent_install.install(name)
    except agent_install.InstallError as exc:
        if exc.network:
            pytest.skip(f"{name}: the package registry is unreachable ({str(exc)[:200]})")
        raise


SHELL_TOOLS = {"exec_command": "cmd", "Bash": "command", "run_shell_command": "command", "bash": "command"}
"""Each agent's shell tool and the name of its command argument (harness-clis.md)."""
SOLVE = "printf 'Hello, world!\\n' > /app/hello.txt"
"""What the sample task `hello-file` asks for: its verifier then gives reward 1."""
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""mini-swe-agent ends only when the model runs this."""


def scripted_agent_reply(name: str, work: str = "echo hi > hello.txt") -> Any:
    """The recorded vLLM reply, turned into the call a capable model would make: the agent's shell
    tool running `work` (writing hello.txt), then (once a tool result is in the prompt) a plain
    "done"."""

    def answer(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        reply = copy.deepcopy(vllm_fixture("chat_basic")["response"])
        choice = reply["choices"][0]
        tools = {t["function"]["name"] for t in body.get("tools") or []}
        shell = next((t for t in SHELL_TOOLS if t in tools), None)
        answered = any(m.get("role") == "tool" for m in body["messages"])
        command = SUBMIT if answered and name == "mini-swe-agent" else work
        if shell and (not answered or command == SUBMIT):
            choice["message"]["content"] = None
            choice["message"]["tool_calls"] = [
                {
                    "id": "chatcmpl-tool-0abc",
                    "type": "function",
                    "function": {"name": shell, "arguments": json.dumps({SHELL_TOOLS[shell]: command})},
                }
            ]
            choice["finish_reason"] = "tool_calls"
        elif shell:
            choice["message"]["content"] = "done"
        return 200, vllm_reply_to(body, reply)

    return answer


def engine_for_agents(answer: Answer) -> FakeVllm:
    """The fake vLLM (not started: use it in a `with`) answering as `answer` says, its listing
    giving `max_model_len` as vLLM reports `--max-model-len 32768`: the recorded server ran 2,048,
    which an agent's first prompt does not fit, and the rollout would be refused before its trial."""
    return FakeVllm(answer=answer, listing=vllm_listing(max_model_len=AGENT_CONTEXT))
