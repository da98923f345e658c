"""Fixtures for the dialect tests: chat replies built from recorded vLLM 0.32 bodies
(tests/fixtures/vllm/), and a scripted engine with a capture server in front (`scripted`,
`upstream`, `capture`, from tests/support/capture_server.py).

A tool-call reply is the recorded `chat_basic` body with its message changed the way vLLM's tool
parser changes it: `content` null, `tool_calls` [{id "chatcmpl-tool-…", type, function{name,
arguments}}], `finish_reason` "tool_calls". A reasoning reply carries vLLM 0.32's `reasoning` key.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.capture_server import capture, scripted, upstream  # noqa: F401  (fixtures)
from tests.support.vllm_recordings import vllm_fixture


def _recorded(name: str) -> dict[str, Any]:
    return vllm_fixture(name)["response"]


@pytest.fixture
def basic_reply() -> dict[str, Any]:
    """chat_basic: "The capital of France is Paris.", finish stop, prompt 37, completion = ids."""
    return _recorded("chat_basic")


@pytest.fixture
def length_reply() -> dict[str, Any]:
    """chat_length: cut by max_tokens (finish "length")."""
    return _recorded("chat_length")


@pytest.fixture
def tool_reply() -> Callable[..., dict[str, Any]]:
    """A vLLM-shaped tool-call reply; `calls` = [(name, arguments string)]."""

    def make(calls: list[tuple[str, str]] | None = None, *, text: str | None = None) -> dict[str, Any]:
        reply = copy.deepcopy(_recorded("chat_basic"))
        choice = reply["choices"][0]
        choice["message"]["content"] = text
        choice["message"]["tool_calls"] = [
            {
                "id": f"chatcmpl-tool-{i}abc",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            for i, (name, arguments) in enumerate(calls or [("get_weather", '{"city": "Paris"}')])
        ]
        choice["finish_reason"] = "tool_calls"
        return reply

    return make


@pytest.fixture
def reasoning_reply() -> dict[str, Any]:
    reply = _recorded("chat_basic")
    reply["choices"][0]["message"]["reasoning"] = "France's capital is Paris."
    return reply
