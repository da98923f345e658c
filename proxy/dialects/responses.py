"""OpenAI Responses (`POST /v1/responses`) ⇄ chat-completions.

Request: `instructions`, `input` (a string or items: messages of any role, `reasoning`,
`function_call` / `function_call_output`, `local_shell_call` / `_output`, `custom_tool_call` /
`_output`), function / `local_shell` / `custom` tools and `namespace` tools (their functions are
flattened to `<namespace>__<name>` and calls come back with OpenAI's `namespace` field), `tool_choice`,
sampling, `max_output_tokens`, `text.format`, `top_logprobs` (the text's logprobs come back when
`include` names `message.output_text.logprobs`, as OpenAI's do). Consecutive assistant-side items
(reasoning, message, calls) become one assistant message, which is exactly how a chat reply is
split into items, so a re-sent history renders as the engine produced it. Reply: a `response`
object (status completed / incomplete, zero-filled usage details) or the SSE sequence
response.created ... response.completed (response.incomplete when cut by length) with
`sequence_number`s.
A tool call is replayed as `local_shell_call` only when the request declared a `local_shell` tool.
`previous_response_id` is resolved before translation, by the session's `StoredResponses`;
`conversation` and a stored `prompt` name content only OpenAI holds, so they are refused (400).
A content part of a type not translated is a 400 naming it and where it was; a `reasoning` item
holding only `encrypted_content` (OpenAI alone reads it) is left out and named in
`context["dropped_parts"]`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from tapdeck.proxy.dialects.base import (
    DialectError,
    DialectRequest,
    SSEEvent,
    loosened_tool_choice,
    objects_at,
    unsupported_part,
)
from tapdeck.proxy.dialects.reply import ChatReply, join_text, read_reply

LOCAL_SHELL = "local_shell"
LOGPROBS_INCLUDE = "message.output_text.logprobs"
NAMESPACE_SEPARATOR = "__"
_LOCAL_SHELL_PARAMETERS = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}},
        "workdir": {"type": "string"},
        "timeout_ms": {"type": "integer"},
    },
    "required": ["command"],
}
_CUSTOM_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
_TEXT_PARTS = {"input_text", "output_text", "text", "summary_text", "reasoning_text"}
_NON_TEXT_PARTS = {"input_image", "input_file", "input_audio", "image_url", "image", "file"}
_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "parallel_tool_calls",
)


def _text_only(kind: str, where: str) -> DialectError:
    return DialectError(
        400,
        f"{where}: content of type '{kind}' is not supported; the engine behind "
        "this proxy is text-only (send text content only)",
        param=where,
    )


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DialectError(400, f"{where} must be a string or a list of content parts", param=where)
    parts = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            parts.append(part)
            continue
        if not isinstance(part, Mapping):
            raise DialectError(
                400, f"{where}[{i}] must be a string or a content part object", param=f"{where}[{i}]"
            )
        kind = part.get("type")
        if kind in _NON_TEXT_PARTS:
            raise _text_only(kind, f"{where}[{i}]")
        if kind == "refusal":
            parts.append(part.get("refusal") or "")
        elif kind in _TEXT_PARTS or "text" in part:
            parts.append(part.get("text") or "")
        else:
            raise unsupported_part(kind, f"{where}[{i}]", "text and refusal parts")
    return join_text(parts)


class _Builder:
    """Accumulates chat messages, folding assistant-side items into one assistant message."""

    def __init__(self) -> None:
        self.system: list[str] = []
        self.messages: list[dict[str, Any]] = []
        self._assistant: dict[str, Any] | None = None

    def assistant(self) -> dict[str, Any]:
        if self._assistant is None:
            self._assistant = {"role": "assistant", "content": ""}
            self.messages.append(self._assistant)
        return self._assistant

    def add_text(self, text: str) -> None:
        message = self.assistant()
        message["content"] = join_text([message["content"], text]) if message["content"] else text

    def add_reasoning(self, text: str) -> None:
        message = self.assistant()
        previous = message.get("reasoning_content")
        message["reasoning_content"] = join_text([previous, text]) if previous else text

    def add_call(self, call_id: str, name: str, arguments: str) -> None:
        self.assistant().setdefault("tool_calls", []).append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )

    def add(self, message: dict[str, Any]) -> None:
        self.close_turn()
        self.messages.append(message)

    def close_turn(self) -> None:
        """The next assistant-side item starts a new assistant message."""
        self._assistant = None


def _convert_input(body: Mapping[str, Any], dropped: list[str]) -> list[dict[str, Any]]:
    """Chat messages; each item left out (it holds nothing an engine can read) is named in `dropped`."""
    builder = _Builder()
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise DialectError(400, "instructions must be a string", param="instructions")
    if instructions:
        builder.system.append(instructions)
    items = body.get("input")
    if items is None:
        raise DialectError(400, "input: a string or a list of input items is required", param="input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    if not isinstance(items, list):
        raise DialectError(400, "input must be a string or a list of items", param="input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise DialectError(400, f"{where} must be an object", param=where)
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            text = _content_text(item.get("content"), f"{where}.content")
            if role in ("system", "developer") and not builder.messages:
                builder.system.append(text)
            elif role in ("system", "developer"):
                # After the first turn it stays where the agent put it (see merge_system_messages).
                builder.add({"role": "system", "content": text})
            elif role == "assistant":
                builder.add_text(text)
            elif role == "user":
                builder.add({"role": "user", "content": text})
            else:
                raise DialectError(
                    400,
                    f"{where}.role {role!r} is not one of user, assistant, system, developer",
                    param=f"{where}.role",
                )
        elif kind == "reasoning":
            content = item.get("content") or item.get("summary") or []
            text = _content_text(content, f"{where}.content")
            if text:
                builder.add_reasoning(text)
            elif item.get("encrypted_content"):
                # Reasoning encrypted by OpenAI, with no text beside it: no other engine can read it.
                dropped.append(f"{where} reasoning (encrypted_content only)")
        elif kind == "function_call":
            builder.add_call(
                item.get("call_id") or item.get("id") or f"call_{i}",
                _call_name(item),
                item.get("arguments") or "{}",
            )
        elif kind == "custom_tool_call":
            builder.add_call(
                item.get("call_id") or item.get("id") or f"call_{i}",
                _call_name(item),
                json.dumps({"input": item.get("input") or ""}, ensure_ascii=False),
            )
        elif kind == "local_shell_call":
            action = item.get("action") or {}
            arguments: dict[str, Any] = {"command": action.get("command") or []}
            if action.get("working_directory"):
                arguments["workdir"] = action["working_directory"]
            if action.get("timeout_ms") is not None:
                arguments["timeout_ms"] = action["timeout_ms"]
            builder.add_call(
                item.get("call_id") or item.get("id") or f"call_{i}",
                LOCAL_SHELL,
                json.dumps(arguments, ensure_ascii=False),
            )
        elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            builder.add(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id") or item.get("id") or "",
                    "content": _content_text(item.get("output"), f"{where}.output"),
                }
            )
        elif kind == "item_reference":
            raise DialectError(
                400,
                f"{where}: item_reference is not supported; send the item itself, "
                "or continue a stored response with previous_response_id",
                param=where,
            )
        elif kind in _NON_TEXT_PARTS:
            raise _text_only(kind, where)
        else:
            raise DialectError(400, f"{where}: input item type {kind!r} is not supported", param=where)
    messages = builder.messages
    if builder.system:
        messages.insert(0, {"role": "system", "content": "\n\n".join(builder.system)})
    if not messages:
        # The engine would answer an empty prompt, and the capture would hold a turn of nothing.
        raise DialectError(
            400, "input is empty and there are no instructions: send at least one input item", param="input"
        )
    return messages


def flat_name(namespace: str, name: str) -> str:
    """The chat function name of `name` inside a `namespace` tool: letters, digits and `_` only
    when both parts are, so every tool-call parser accepts it (`multi_agent_v1__spawn_agent`)."""
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}"


def _flatten_namespaces(tools: Any) -> tuple[list[Any], dict[str, list[str]]]:
    """`namespace` tools replaced by their inner tools under flat names, and the map from each
    flat name back to `[namespace, name]` (the reply's calls are mapped back through it)."""
    out: list[Any] = []
    names: dict[str, list[str]] = {}
    for tool in tools or []:
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            namespace = str(tool.get("name") or "")
            for inner in tool.get("tools") or []:
                if not isinstance(inner, dict):
                    continue
                flat = flat_name(namespace, str(inner.get("name") or ""))
                names[flat] = [namespace, str(inner.get("name") or "")]
                out.append({**inner, "name": flat})
        else:
            out.append(tool)
    return out, names


def _call_name(item: Mapping[str, Any]) -> str:
    """A re-sent call's chat name: flat when the call names the namespace of its tool."""
    name = str(item.get("name") or "")
    namespace = item.get("namespace")
    return flat_name(namespace, name) if isinstance(namespace, str) and namespace else name


def _convert_tools(tools: Any) -> tuple[list[dict[str, Any]], set[str], set[str], list[str]]:
    """Chat tools, the declared custom tool names, local_shell names, and the hosted tools dropped.
    `namespace` tools must already be flattened (`_flatten_namespaces`)."""
    out, custom, local, dropped = [], set(), set(), []
    for tool in tools or []:
        kind = tool.get("type")
        if kind == "function":
            function: dict[str, Any] = {
                "name": tool.get("name") or "",
                "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
            }
            if tool.get("description"):
                function["description"] = tool["description"]
            if tool.get("strict") is not None:
                function["strict"] = tool["strict"]
            out.append({"type": "function", "function": function})
        elif kind == "custom":
            custom.add(tool.get("name") or "")
            function = {"name": tool.get("name") or "", "parameters": _CUSTOM_PARAMETERS}
            if tool.get("description"):
                function["description"] = tool["description"]
            out.append({"type": "function", "function": function})
        elif kind == LOCAL_SHELL:
            local.add(LOCAL_SHELL)
            out.append(
                {
                    "type": "function",
                    "function": {
                        "name": LOCAL_SHELL,
                        "description": "Run a command on the local machine.",
                        "parameters": _LOCAL_SHELL_PARAMETERS,
                    },
                }
            )
        else:
            # Hosted tools (web_search, file_search, ...) run at OpenAI; a local engine cannot.
            dropped.append(str(kind))
    return out, custom, local, dropped


def _convert_tool_choice(choice: Any, dropped: list[str], tool_names: list[str]) -> tuple[Any, str | None]:
    """The chat `tool_choice` (None for auto), and what of an `allowed_tools` subset it cannot
    carry (or None). A choice forcing a dropped hosted tool is a 400: answering without it would
    silently do something else than the client asked."""
    if isinstance(choice, str):
        return choice, None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("function", "custom"):
        return {"type": "function", "function": {"name": choice.get("name") or ""}}, None
    if kind == LOCAL_SHELL:
        return {"type": "function", "function": {"name": LOCAL_SHELL}}, None
    if kind == "allowed_tools":
        allowed = [
            t.get("name") or ""
            for t in objects_at(choice.get("tools"), "tool_choice.tools")
            if t.get("type") in ("function", "custom")
        ]
        if choice.get("mode") != "required":
            return None, loosened_tool_choice("tool_choice.tools", allowed, tool_names)
        if len(allowed) == 1:
            return {"type": "function", "function": {"name": allowed[0]}}, None
        return "required", loosened_tool_choice("tool_choice.tools", allowed, tool_names)
    if kind in dropped:
        raise DialectError(
            400,
            f"tool_choice forces the hosted tool {kind!r}, which runs only at "
            "OpenAI: tapdeck drops hosted tools, so the engine cannot call it",
            param="tool_choice",
        )
    return None, None


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = (text or {}).get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_schema":
        schema = {"name": fmt.get("name") or "response", "schema": fmt.get("schema") or {}}
        if fmt.get("strict") is not None:
            schema["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": schema}
    return {"type": fmt["type"]}


class ResponsesDialect:
    """OpenAI Responses API."""

    name: ClassVar[str] = "responses"
    chat_field_names: ClassVar[Mapping[str, str]] = {
        "response_format": "text.format",
        "max_tokens": "max_output_tokens",
    }

    def matches(self, path: str) -> bool:
        return path.split("?", 1)[0].lower().rstrip("/").endswith("/responses")

    def parse(self, body: Mapping[str, Any], path: str, query: Mapping[str, str]) -> DialectRequest:
        if not isinstance(body, Mapping):
            raise DialectError(400, "the request body must be a JSON object")
        if isinstance(body.get("n"), int) and body["n"] > 1:
            raise DialectError(400, "n > 1 is not supported: one completion per call", param="n")
        _refuse_server_state(body)
        dropped_parts: list[str] = []
        chat: dict[str, Any] = {"model": body.get("model"), "messages": _convert_input(body, dropped_parts)}
        flat_tools, namespaced = _flatten_namespaces(objects_at(body.get("tools"), "tools"))
        tools, custom, local, dropped = _convert_tools(flat_tools)
        choice, loosened = _convert_tool_choice(
            body.get("tool_choice"), dropped, [t["function"]["name"] for t in tools]
        )
        if tools:
            chat["tools"] = tools
            if choice is not None:
                chat["tool_choice"] = choice
        for key in _SAMPLING:
            if body.get(key) is not None:
                chat[key] = body[key]
        if body.get("max_output_tokens") is not None:
            chat["max_tokens"] = body["max_output_tokens"]
        if body.get("stop"):
            chat["stop"] = body["stop"]
        fmt = _response_format(body.get("text"))
        if fmt is not None:
            chat["response_format"] = fmt
        top_logprobs = _asked_logprobs(body)
        if top_logprobs is not None:
            chat["logprobs"], chat["top_logprobs"] = True, top_logprobs
        echo = {
            key: body.get(key)
            for key in ("instructions", "temperature", "top_p", "max_output_tokens", "metadata", "user")
        }
        echo["tools"] = list(body.get("tools") or [])
        echo["tool_choice"] = body.get("tool_choice") or "auto"
        echo["parallel_tool_calls"] = body.get("parallel_tool_calls", True) is not False
        echo["text"] = body.get("text") or {"format": {"type": "text"}}
        echo["reasoning"] = body.get("reasoning")
        echo["previous_response_id"] = body.get("previous_response_id")
        echo["store"] = body.get("store") is not False
        echo["top_logprobs"] = body.get("top_logprobs")
        return DialectRequest(
            chat=chat,
            stream=body.get("stream") is True,
            client_model=body.get("model"),
            context={
                "echo": echo,
                "custom_tools": sorted(custom),
                "top_logprobs": top_logprobs,
                "local_shell": bool(local),
                "dropped_tools": dropped,
                "dropped_parts": dropped_parts,
                "namespaced": namespaced,
                "loosened_tool_choice": loosened if tools else None,
            },
        )

    # ---- replies -------------------------------------------------------------------------------

    @staticmethod
    def _items(
        reply: ChatReply, request: DialectRequest, logprobs: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        status = "incomplete" if reply.truncated else "completed"
        items: list[dict[str, Any]] = []
        if reply.reasoning:
            items.append(
                {
                    "type": "reasoning",
                    "id": f"rs_{reply.id}",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": reply.reasoning}],
                    "status": status,
                }
            )
        if reply.text or not reply.tool_calls:
            items.append(
                {
                    "type": "message",
                    "id": f"msg_{reply.id}",
                    "status": status,
                    "role": "assistant",
                    "content": [
                        {"type": "output_text", "text": reply.text, "annotations": [], "logprobs": logprobs}
                    ],
                }
            )
        custom = set(request.context.get("custom_tools") or [])
        namespaced = request.context.get("namespaced") or {}
        for n, call in enumerate(reply.tool_calls):
            item_id = f"fc_{reply.id}_{n}"
            # A call to a tool of a `namespace` goes back as OpenAI writes one: its own name plus
            # a `namespace` field.
            where = {"namespace": namespaced[call.name][0]} if call.name in namespaced else {}
            name = namespaced[call.name][1] if call.name in namespaced else call.name
            if call.name == LOCAL_SHELL and request.context.get("local_shell"):
                arguments = _object(call.arguments)
                action: dict[str, Any] = {
                    "type": "exec",
                    "command": arguments.get("command") or [],
                    "env": {},
                }
                if arguments.get("workdir"):
                    action["working_directory"] = arguments["workdir"]
                if arguments.get("timeout_ms") is not None:
                    action["timeout_ms"] = arguments["timeout_ms"]
                items.append(
                    {
                        "type": "local_shell_call",
                        "id": item_id,
                        "call_id": call.id,
                        "action": action,
                        "status": "completed",
                    }
                )
            elif call.name in custom:
                items.append(
                    {
                        "type": "custom_tool_call",
                        "id": item_id,
                        "call_id": call.id,
                        **where,
                        "name": name,
                        "input": str(_object(call.arguments).get("input", "")),
                    }
                )
            else:
                items.append(
                    {
                        "type": "function_call",
                        "id": item_id,
                        "call_id": call.id,
                        **where,
                        "name": name,
                        "arguments": call.arguments,
                        "status": "completed",
                    }
                )
        return items

    @staticmethod
    def _usage(reply: ChatReply) -> dict[str, Any]:
        return {
            "input_tokens": reply.prompt_tokens,
            "input_tokens_details": {"cached_tokens": reply.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": reply.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": reply.reasoning_tokens},
            "total_tokens": reply.total_tokens,
        }

    @staticmethod
    def _response(
        reply: ChatReply,
        request: DialectRequest,
        *,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None,
    ) -> dict[str, Any]:
        echo = request.context.get("echo") or {}
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": f"resp_{reply.id}",
            "object": "response",
            "created_at": reply.created,
            "status": status,
            "completed_at": int(time.time()) if status != "in_progress" else None,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": echo.get("instructions"),
            "max_output_tokens": echo.get("max_output_tokens"),
            "model": request.client_model or "",
            "output": output,
            "parallel_tool_calls": echo.get("parallel_tool_calls", True),
            "previous_response_id": echo.get("previous_response_id"),
            "reasoning": echo.get("reasoning"),
            "store": echo.get("store", True),
            "temperature": echo.get("temperature"),
            "text": echo.get("text") or {"format": {"type": "text"}},
            "tool_choice": echo.get("tool_choice") or "auto",
            "tools": echo.get("tools") or [],
            "top_p": echo.get("top_p"),
            "top_logprobs": echo.get("top_logprobs"),
            "truncation": "disabled",
            "usage": usage,
            "user": echo.get("user"),
            "metadata": echo.get("metadata") or {},
        }

    def render(self, reply: Mapping[str, Any], request: DialectRequest) -> dict[str, Any]:
        parsed = read_reply(reply)
        status = "incomplete" if parsed.truncated else "completed"
        return self._response(
            parsed,
            request,
            status=status,
            output=self._items(parsed, request, _text_logprobs(reply, request)),
            usage=self._usage(parsed),
        )

    def render_stream(self, reply: Mapping[str, Any], request: DialectRequest) -> Iterator[SSEEvent]:
        parsed = read_reply(reply)
        status = "incomplete" if parsed.truncated else "completed"
        items = self._items(parsed, request, _text_logprobs(reply, request))
        counter = iter(range(1 << 30))

        def event(kind: str, **fields: Any) -> SSEEvent:
            return SSEEvent(data={"type": kind, "sequence_number": next(counter), **fields}, event=kind)

        shell = self._response(parsed, request, status="in_progress", output=[], usage=None)
        yield event("response.created", response=shell)
        yield event("response.in_progress", response=shell)
        for index, item in enumerate(items):
            item_id = item["id"]
            kind = item["type"]
            if kind == "message":
                yield event(
                    "response.output_item.added",
                    output_index=index,
                    item=item | {"status": "in_progress", "content": []},
                )
                part = item["content"][0]
                yield event(
                    "response.content_part.added",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    part=part | {"text": "", "logprobs": []},
                )
                if part["text"]:
                    yield event(
                        "response.output_text.delta",
                        item_id=item_id,
                        output_index=index,
                        content_index=0,
                        delta=part["text"],
                        logprobs=part["logprobs"],
                    )
                yield event(
                    "response.output_text.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    text=part["text"],
                    logprobs=part["logprobs"],
                )
                yield event(
                    "response.content_part.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    part=part,
                )
            elif kind == "reasoning":
                yield event(
                    "response.output_item.added",
                    output_index=index,
                    item=item | {"status": "in_progress", "content": []},
                )
                text = item["content"][0]["text"]
                yield event(
                    "response.content_part.added",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    part={"type": "reasoning_text", "text": ""},
                )
                yield event(
                    "response.reasoning_text.delta",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    delta=text,
                )
                yield event(
                    "response.reasoning_text.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    text=text,
                )
                yield event(
                    "response.content_part.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    part=item["content"][0],
                )
            elif kind == "function_call":
                yield event(
                    "response.output_item.added",
                    output_index=index,
                    item=item | {"status": "in_progress", "arguments": ""},
                )
                yield event(
                    "response.function_call_arguments.delta",
                    item_id=item_id,
                    output_index=index,
                    delta=item["arguments"],
                )
                yield event(
                    "response.function_call_arguments.done",
                    item_id=item_id,
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            elif kind == "custom_tool_call":
                yield event("response.output_item.added", output_index=index, item=item | {"input": ""})
                yield event(
                    "response.custom_tool_call_input.delta",
                    item_id=item_id,
                    output_index=index,
                    delta=item["input"],
                )
                yield event(
                    "response.custom_tool_call_input.done",
                    item_id=item_id,
                    output_index=index,
                    input=item["input"],
                )
            else:
                yield event(
                    "response.output_item.added", output_index=index, item=item | {"status": "in_progress"}
                )
            yield event("response.output_item.done", output_index=index, item=item)
        # A length-cut reply ends with `response.incomplete`, as OpenAI's does: clients that only
        # watch for the terminal event's type would take `response.completed` as a finished answer.
        yield event(
            f"response.{status}",
            response=self._response(parsed, request, status=status, output=items, usage=self._usage(parsed)),
        )

    # ---- errors --------------------------------------------------------------------------------

    def error_body(self, status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "param": param, "code": _error_code(status)}}

    def stream_error(self, status: int, message: str, kind: str) -> Iterator[SSEEvent]:
        code = _error_code(status)
        yield SSEEvent(
            data={"type": "error", "sequence_number": 0, "code": code, "message": message, "param": None},
            event="error",
        )
        failed = {
            "id": "resp_error",
            "object": "response",
            "created_at": int(time.time()),
            "status": "failed",
            "error": {"code": code, "message": message},
            "incomplete_details": None,
            "model": "",
            "output": [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": None,
        }
        yield SSEEvent(
            data={"type": "response.failed", "sequence_number": 1, "response": failed},
            event="response.failed",
        )


_SERVER_STATE = {
    "conversation": "a conversation's items live at OpenAI; send the full conversation as input, "
    "or chain calls with previous_response_id",
    "prompt": "a stored prompt template lives at OpenAI; send its text as instructions and input",
}
"""Request fields that stand for content only OpenAI's servers hold."""


def _refuse_server_state(body: Mapping[str, Any]) -> None:
    """A 400 for a field naming server-held content: answered without it, the model would never
    see that content and nothing would say so."""
    for key, instead in _SERVER_STATE.items():
        if body.get(key) is not None:
            raise DialectError(400, f"{key} is not supported by tapdeck: {instead}", param=key)


def _asked_logprobs(body: Mapping[str, Any]) -> int | None:
    """How many alternatives per token the client wants with its text's logprobs (None: no
    logprobs): OpenAI returns them only when `include` names `message.output_text.logprobs`."""
    include = body.get("include")
    if not isinstance(include, list) or LOGPROBS_INCLUDE not in include:
        return None
    top = body.get("top_logprobs")
    return top if type(top) is int and top > 0 else 0


def _text_logprobs(reply: Mapping[str, Any], request: DialectRequest) -> list[dict[str, Any]]:
    """The reply's per-token logprobs in Responses' shape, with as many alternatives as asked
    (the engine may have been asked for more, to capture them); `[]` when none were asked."""
    top = request.context.get("top_logprobs")
    choice = (reply.get("choices") or [{}])[0] or {}
    logprobs = choice.get("logprobs")
    if top is None or not isinstance(logprobs, Mapping) or not isinstance(logprobs.get("content"), list):
        return []
    return [
        {
            "token": e.get("token") or "",
            "logprob": e.get("logprob"),
            "bytes": e.get("bytes") or [],
            "top_logprobs": [
                {"token": a.get("token") or "", "logprob": a.get("logprob"), "bytes": a.get("bytes") or []}
                for a in (e.get("top_logprobs") or [])[:top]
            ],
        }
        for e in logprobs["content"]
        if isinstance(e, Mapping)
    ]


def _error_code(status: int) -> str:
    if status == 401:
        return "invalid_api_key"
    if status == 429:
        return "rate_limit_exceeded"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def _object(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


DIALECT = ResponsesDialect()
