"""Reading the proxy's chat-completions reply once, for the dialects that re-render it.

The reply is shaped like vLLM's (tests/fixtures/vllm/): `choices[0].message` with `content`,
optional `tool_calls`, reasoning as `reasoning` (vLLM ≥ 0.10) or `reasoning_content`;
`finish_reason`, `stop_reason` (the matched stop string, null for EOS) and `usage` whose detail
objects may be null. Missing usage falls back to the id counts so clients never read nulls.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """One tool call of the reply; `arguments` is the exact string the engine produced."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatReply:
    """The parts of a chat reply every dialect renders."""

    id: str
    created: int
    text: str
    reasoning: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    stop_reason: str | None = None
    """The stop string that ended generation, when one did (vLLM `choices[0].stop_reason`)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def truncated(self) -> bool:
        """Generation stopped at the token limit."""
        return self.finish_reason == "length"


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def read_reply(reply: Mapping[str, Any]) -> ChatReply:
    """Extract text, reasoning, tool calls, finish reason and zero-filled usage from a chat reply."""
    choices = reply.get("choices") or [{}]
    choice = choices[0] or {}
    message = choice.get("message") or {}
    calls = []
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = "{}" if arguments is None else json.dumps(arguments, ensure_ascii=False)
        calls.append(
            ToolCall(
                id=call.get("id") or f"call_{uuid.uuid4().hex[:24]}_{index}",
                name=function.get("name") or "",
                arguments=arguments,
            )
        )
    usage = reply.get("usage") or {}
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    prompt_tokens = usage.get("prompt_tokens")
    if not isinstance(prompt_tokens, int):
        ids = reply.get("prompt_token_ids")
        prompt_tokens = 0 if ids is None else len(ids)
    completion_tokens = usage.get("completion_tokens")
    if not isinstance(completion_tokens, int):
        completion_tokens = len(choice.get("token_ids") or [])
    stop_reason = choice.get("stop_reason")
    finish = choice.get("finish_reason") or "stop"
    if calls and finish == "stop":
        finish = "tool_calls"
    reply_id = str(reply.get("id") or uuid.uuid4().hex)
    return ChatReply(
        id=reply_id.removeprefix("chatcmpl-"),
        created=_int(reply.get("created")) or int(time.time()),
        text=message.get("content") or "",
        reasoning=message.get("reasoning_content") or message.get("reasoning") or "",
        tool_calls=calls,
        finish_reason=finish,
        stop_reason=stop_reason if isinstance(stop_reason, str) else None,
        prompt_tokens=_int(prompt_tokens),
        completion_tokens=_int(completion_tokens),
        cached_tokens=_int(prompt_details.get("cached_tokens")),
        reasoning_tokens=_int(completion_details.get("reasoning_tokens")),
    )


def join_text(parts: list[str]) -> str:
    """Text parts of one message joined the way vLLM flattens multi-part text content ("\\n")."""
    return "\n".join(parts)
