"""Anthropic Messages (`POST /v1/messages`) ⇄ chat-completions.

Request: `system` (string or text blocks; Claude Code's per-request `x-anthropic-billing-header:`
line removed so the prompt stays byte-stable), `messages` with text / `tool_use` / `tool_result` /
`thinking` blocks, `tools[].input_schema`, `tool_choice`, sampling and `stop_sequences`. Server
tools and `mcp_servers` (run by Anthropic) are dropped and named in `context["dropped_tools"]`. A final
assistant text (a prefill) is continued, as Anthropic continues it. `redacted_thinking` blocks
(encrypted: only Anthropic reads them) are left out and named in `context["dropped_parts"]`; any
other block type is a 400 naming it and where it was, never dropped silently.
Reply: a `message` body with `stop_reason` end_turn / max_tokens / tool_use / stop_sequence, or the
SSE sequence message_start, content_block_start/delta/stop, message_delta, message_stop.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from tapdeck.proxy.dialects.arguments import current_memo
from tapdeck.proxy.dialects.base import (
    DialectError,
    DialectRequest,
    SSEEvent,
    emptied_message,
    object_at,
    objects_at,
    strings_at,
    unsupported_part,
)
from tapdeck.proxy.dialects.chat import merge_system_messages
from tapdeck.proxy.dialects.reply import ChatReply, join_text, read_reply

_BILLING_LINE = re.compile(r"^x-anthropic-billing-header:.*(?:\r?\n)?", re.MULTILINE | re.IGNORECASE)
_NON_TEXT = {"image", "document", "file", "container_upload", "search_result"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
    529: "overloaded_error",
}
_KNOWN_ERROR_TYPES = set(_ERROR_TYPES.values())


def strip_billing_header(text: str) -> str:
    """Remove Claude Code's per-request attribution line (its hash changes on every call)."""
    return _BILLING_LINE.sub("", text)


def _text_only(kind: str, where: str) -> DialectError:
    return DialectError(
        400,
        f"{where}: content of type '{kind}' is not supported; the engine behind "
        "this proxy is text-only (send text content only)",
        param=where,
    )


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b if isinstance(b, dict) else {"type": "text", "text": str(b)} for b in content]
    raise DialectError(400, f"{where} must be a string or a list of content blocks", param=where)


def _tool_result_text(block: Mapping[str, Any], where: str) -> str:
    parts = []
    for i, inner in enumerate(_blocks(block.get("content"), f"{where}.content")):
        kind = inner.get("type", "text")
        if kind in _NON_TEXT:
            raise _text_only(kind, f"{where}.content[{i}]")
        if kind != "text":
            raise unsupported_part(kind, f"{where}.content[{i}]", "text blocks in a tool_result")
        parts.append(inner.get("text") or "")
    return join_text(parts)


def _system_text(system: Any) -> str:
    parts = []
    for i, block in enumerate(_blocks(system, "system")):
        kind = block.get("type", "text")
        if kind in _NON_TEXT:
            raise _text_only(kind, f"system[{i}]")
        if kind != "text":
            raise unsupported_part(kind, f"system[{i}]", "text blocks in the system prompt")
        text = strip_billing_header(block.get("text") or "")
        if text.strip():
            parts.append(text)
    return "\n\n".join(parts)


def _convert_messages(messages: Any, dropped: list[str]) -> list[dict[str, Any]]:
    """Chat messages; each block left out (it holds nothing an engine can read) is named in `dropped`."""
    if not isinstance(messages, list) or not messages:
        raise DialectError(400, "messages: a non-empty list of messages is required", param="messages")
    out: list[dict[str, Any]] = []
    for m, message in enumerate(messages):
        where = f"messages[{m}]"
        if not isinstance(message, dict):
            raise DialectError(400, f"{where} must be an object", param=where)
        role = message.get("role")
        blocks = _blocks(message.get("content"), f"{where}.content")
        if role == "assistant":
            text, reasoning, calls, left_out = [], [], [], []
            for b, block in enumerate(blocks):
                kind = block.get("type", "text")
                if kind == "text":
                    text.append(block.get("text") or "")
                elif kind == "thinking":
                    reasoning.append(block.get("thinking") or "")
                elif kind == "tool_use":
                    name = block.get("name") or ""
                    calls.append(
                        {
                            "id": block.get("id") or f"toolu_{m}_{b}",
                            "type": "function",
                            "function": {
                                "name": name,
                                "arguments": current_memo().encode(name, block.get("input") or {}),
                            },
                        }
                    )
                elif kind in _NON_TEXT:
                    raise _text_only(kind, f"{where}.content[{b}]")
                elif kind == "redacted_thinking":
                    # Reasoning encrypted by Anthropic: no other engine can read it.
                    left_out.append(f"{where}.content[{b}] redacted_thinking (encrypted reasoning)")
                else:
                    raise unsupported_part(
                        kind,
                        f"{where}.content[{b}]",
                        "text, thinking, redacted_thinking and tool_use blocks from the assistant",
                    )
            if left_out and not (text or reasoning or calls):
                raise emptied_message(where, left_out)
            dropped.extend(left_out)
            chat: dict[str, Any] = {"role": "assistant", "content": join_text([t for t in text if t])}
            if reasoning:
                chat["reasoning_content"] = join_text(reasoning)
            if calls:
                chat["tool_calls"] = calls
            out.append(chat)
        elif role in ("user", "system"):
            pending: list[str] = []
            for b, block in enumerate(blocks):
                kind = block.get("type", "text")
                if kind == "tool_result":
                    if pending:
                        out.append({"role": role, "content": join_text(pending)})
                        pending = []
                    out.append(
                        {
                            "role": "tool",
                            "tool_call_id": block.get("tool_use_id") or "",
                            "content": _tool_result_text(block, f"{where}.content[{b}]"),
                        }
                    )
                elif kind == "text":
                    said = block.get("text") or ""
                    pending.append(strip_billing_header(said) if role == "system" else said)
                elif kind in _NON_TEXT:
                    raise _text_only(kind, f"{where}.content[{b}]")
                else:
                    raise unsupported_part(
                        kind, f"{where}.content[{b}]", f"text and tool_result blocks from the {role}"
                    )
            if pending or not blocks:
                out.append({"role": role, "content": join_text(pending)})
        else:
            raise DialectError(
                400, f"{where}.role must be 'user' or 'assistant', got {role!r}", param=f"{where}.role"
            )
    return out


def _convert_tools(tools: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Chat tools, and the server tools dropped (by their versioned type, e.g. `web_search_20250305`)."""
    out, dropped = [], []
    for tool in tools or []:
        if not isinstance(tool, dict) or "input_schema" not in tool:
            # Server tools (web_search, code_execution, bash/text_editor computer use) run at
            # Anthropic or in its client-side harness contract; a local engine cannot run them.
            dropped.append(str(tool.get("type") or tool.get("name")) if isinstance(tool, dict) else str(tool))
            continue
        function: dict[str, Any] = {"name": tool.get("name") or "", "parameters": tool["input_schema"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out, dropped


def _convert_tool_choice(choice: Any) -> tuple[Any, bool | None]:
    if not isinstance(choice, dict):
        return None, None
    parallel = False if choice.get("disable_parallel_tool_use") else None
    kind = choice.get("type")
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name") or ""}}, parallel
    return "auto", parallel


class AnthropicDialect:
    """Anthropic Messages API."""

    name: ClassVar[str] = "anthropic"
    chat_field_names: ClassVar[Mapping[str, str]] = {
        "response_format": "output_config.format",
        "stop": "stop_sequences",
    }

    def matches(self, path: str) -> bool:
        lowered = path.split("?", 1)[0].lower().rstrip("/")
        return lowered.endswith("/messages") or lowered.endswith("/messages/count_tokens")

    def parse(self, body: Mapping[str, Any], path: str, query: Mapping[str, str]) -> DialectRequest:
        if not isinstance(body, Mapping):
            raise DialectError(400, "the request body must be a JSON object")
        dropped_parts: list[str] = []
        messages = _convert_messages(body.get("messages"), dropped_parts)
        system = _system_text(body.get("system"))
        if system:
            messages.insert(0, {"role": "system", "content": system})
        # `role: "system"` inside `messages` (Claude Code's reminders) joins the leading system
        # prompt only when it leads; later ones stay where they are (see merge_system_messages).
        messages = merge_system_messages(messages)
        chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
        last = messages[-1]
        if last["role"] == "assistant" and last["content"] and not last.get("tool_calls"):
            # A prefill: Anthropic continues the final assistant text rather than answering after
            # it, so the engine renders it open (vLLM's option), with no new assistant header.
            chat["continue_final_message"] = True
            chat["add_generation_prompt"] = False
        if isinstance(body.get("n"), int) and body["n"] > 1:
            raise DialectError(400, "n > 1 is not supported: one completion per call", param="n")
        tools, dropped = _convert_tools(objects_at(body.get("tools"), "tools"))
        # MCP servers are reached by Anthropic's own connector: their tools are hosted tools too.
        dropped += [
            f"mcp_servers[{server.get('name') or server.get('url') or i}]"
            for i, server in enumerate(objects_at(body.get("mcp_servers"), "mcp_servers"))
        ]
        if tools:
            chat["tools"] = tools
            choice, parallel = _convert_tool_choice(body.get("tool_choice"))
            if choice is not None:
                chat["tool_choice"] = choice
            if parallel is not None:
                chat["parallel_tool_calls"] = parallel
        for key in ("max_tokens", "temperature", "top_p", "top_k"):
            if body.get(key) is not None:
                chat[key] = body[key]
        stops = strings_at(body.get("stop_sequences"), "stop_sequences")
        if stops:
            chat["stop"] = list(stops)
        fmt = object_at(body.get("output_config"), "output_config").get("format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            chat["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": fmt.get("schema") or {}},
            }
        return DialectRequest(
            chat=chat,
            stream=body.get("stream") is True,
            client_model=body.get("model"),
            context={
                "stop_sequences": list(stops),
                "dropped_tools": dropped,
                "dropped_parts": dropped_parts,
                "object_arguments": True,
            },
        )

    # ---- replies -------------------------------------------------------------------------------

    @staticmethod
    def _stop(reply: ChatReply, request: DialectRequest) -> tuple[str, str | None]:
        if reply.tool_calls:
            return "tool_use", None
        if reply.truncated:
            return "max_tokens", None
        if reply.stop_reason is not None and reply.stop_reason in request.context.get("stop_sequences", []):
            return "stop_sequence", reply.stop_reason
        return "end_turn", None

    @staticmethod
    def _content(reply: ChatReply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if reply.reasoning:
            blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        for call in reply.tool_calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": current_memo().decode(call.name, call.arguments),
                }
            )
        return blocks

    @staticmethod
    def _usage(reply: ChatReply) -> dict[str, Any]:
        # Anthropic's `input_tokens` are the prompt tokens NOT read from cache (a client's context
        # size is their sum with `cache_read_input_tokens`); vLLM's `prompt_tokens` count them all.
        cached = min(reply.cached_tokens, reply.prompt_tokens)
        return {
            "input_tokens": reply.prompt_tokens - cached,
            "output_tokens": reply.completion_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
        }

    def render(self, reply: Mapping[str, Any], request: DialectRequest) -> dict[str, Any]:
        parsed = read_reply(reply)
        stop_reason, stop_sequence = self._stop(parsed, request)
        return {
            "id": f"msg_{parsed.id}",
            "type": "message",
            "role": "assistant",
            "model": request.client_model or "",
            "content": self._content(parsed),
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": self._usage(parsed),
        }

    def render_stream(self, reply: Mapping[str, Any], request: DialectRequest) -> Iterator[SSEEvent]:
        parsed = read_reply(reply)
        stop_reason, stop_sequence = self._stop(parsed, request)
        start_usage = self._usage(parsed) | {"output_tokens": 0}
        yield _event(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": f"msg_{parsed.id}",
                    "type": "message",
                    "role": "assistant",
                    "model": request.client_model or "",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
        )
        for index, block in enumerate(self._content(parsed)):
            kind = block["type"]
            start: dict[str, Any]
            if kind == "thinking":
                start = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [
                    {"type": "thinking_delta", "thinking": block["thinking"]},
                    {"type": "signature_delta", "signature": ""},
                ]
            elif kind == "text":
                start = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": block["text"]}]
            else:
                start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                # The SDK parses the concatenated deltas, so send JSON that is known to parse.
                deltas = [
                    {
                        "type": "input_json_delta",
                        "partial_json": json.dumps(block["input"], ensure_ascii=False),
                    }
                ]
            yield _event(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
            )
            for delta in deltas:
                yield _event(
                    "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
                )
            yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
        yield _event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": self._usage(parsed),
            },
        )
        yield _event("message_stop", {"type": "message_stop"})

    # ---- errors --------------------------------------------------------------------------------

    def error_body(self, status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
        error_type = (
            kind
            if kind in _KNOWN_ERROR_TYPES
            else _ERROR_TYPES.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")
        )
        return {"type": "error", "error": {"type": error_type, "message": message}}

    def stream_error(self, status: int, message: str, kind: str) -> Iterator[SSEEvent]:
        yield _event("error", self.error_body(status, message, kind))


def _event(name: str, data: dict[str, Any]) -> SSEEvent:
    return SSEEvent(data=data, event=name)


DIALECT = AnthropicDialect()
