"""Google generateContent / streamGenerateContent ⇄ chat-completions.

Request: `systemInstruction`, `contents[].parts[]` (`text`, `thought` text, `functionCall`,
`functionResponse`), `tools[].functionDeclarations` (OpenAPI-style upper-case schema types are
lowered to JSON Schema), `toolConfig.functionCallingConfig`, `generationConfig`. REST accepts both
camelCase and snake_case field names, so both are read. Function calls carry no id unless the client
sends one, so the k-th call of a conversation gets the id `call_k` (replies number their calls the
same way): a re-sent history renders identically whether or not the client echoes ids.
With `responseLogprobs` the final candidate carries `avgLogprobs` and `logprobsResult` (`logprobs`
alternatives per token), from the engine's own logprobs.
Streaming is requested in the URL (`:streamGenerateContent` or `alt=sse`), never in the body. With
`alt=sse` the stream is data-only SSE, each event one GenerateContentResponse chunk; without it,
Google's JSON-array form: `[`, the same chunks comma-separated, `]` (application/json). Built-in
tools (googleSearch, codeExecution, urlContext, ...) are dropped and named in
`context["dropped_tools"]`; `cachedContent` names content only Google holds, so it is refused (400).
A part holding anything but text, a functionCall (from the model) or a functionResponse (from the
user) is a 400 naming the field and where it was; a part of metadata alone (a bare
`thoughtSignature`) is left out and named in `context["dropped_parts"]`.
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
    loosened_tool_choice,
    object_at,
    objects_at,
    strings_at,
    unsupported_part,
)
from tapdeck.proxy.dialects.reply import ChatReply, join_text, read_reply

_MODEL_IN_PATH = re.compile(r"/models/([^/:]+)", re.IGNORECASE)
_NON_TEXT = ("inlineData", "inline_data", "fileData", "file_data")
_PART_DATA = {
    "text": "text",
    "functionCall": "functionCall",
    "function_call": "functionCall",
    "functionResponse": "functionResponse",
    "function_response": "functionResponse",
}
_PART_METADATA = {
    "thought",
    "thoughtSignature",
    "thought_signature",
    "partMetadata",
    "part_metadata",
    "videoMetadata",
    "video_metadata",
    "mediaResolution",
    "media_resolution",
}
"""Fields of a part that describe its data rather than hold any."""
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_SCHEMA_TYPES = {"STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"}
JSON_ARRAY = "json_array"
"""`DialectRequest.context["stream_format"]` of a stream without `alt=sse`: Google then sends one
JSON array of GenerateContentResponse objects (application/json), not SSE."""


def _get(mapping: Mapping[str, Any], camel: str, snake: str) -> Any:
    value = mapping.get(camel)
    return mapping.get(snake) if value is None else value


def is_sse(query: Mapping[str, str]) -> bool:
    """Whether the query asks for server-sent events (`alt=sse`, any case)."""
    return any(k.lower() == "alt" and str(v).lower() == "sse" for k, v in query.items())


def is_streaming(path: str, query: Mapping[str, str]) -> bool:
    """Google streams when the method is `:streamGenerateContent` or the query asks `alt=sse`."""
    return "streamgeneratecontent" in path.lower() or is_sse(query)


def model_from_path(path: str) -> str | None:
    """`/v1beta/models/gemini-2.5-pro:generateContent` → `gemini-2.5-pro`."""
    match = _MODEL_IN_PATH.search(path)
    return match.group(1) if match else None


def json_schema(schema: Any) -> Any:
    """An OpenAPI-subset Google schema as JSON Schema (`"type": "OBJECT"` → `"object"`)."""
    if isinstance(schema, list):
        return [json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str) and value.upper() in _SCHEMA_TYPES:
            out[key] = value.lower()
        elif key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: json_schema(sub) for name, sub in value.items()}
        else:
            out[key] = json_schema(value)
    return out


def _text_only(key: str, where: str) -> DialectError:
    return DialectError(
        400,
        f"{where}: '{key}' parts are not supported; the engine behind this proxy "
        "is text-only (send text parts only)",
        param=where,
    )


def _held(part: Mapping[str, Any], where: str, allowed: tuple[str, ...], dropped: list[str]) -> bool:
    """Whether a part holds data the translation keeps: text, or a call or response where `allowed`.
    Media and any other data field are a 400 naming it; a part of metadata alone (a bare
    `thoughtSignature`) holds nothing an engine can read, and is named in `dropped`."""
    for key in _NON_TEXT:
        if key in part:
            raise _text_only(key, where)
    fields = [key for key, value in part.items() if value is not None]
    for key in fields:
        if key not in _PART_DATA and key not in _PART_METADATA:
            raise unsupported_part(key, where, "text, functionCall and functionResponse parts")
    data = sorted({_PART_DATA[key] for key in fields if key in _PART_DATA})
    if len(data) > 1:
        # Google's part is one of them; translating one would drop the other.
        raise DialectError(400, f"{where}: a part holds one of {' or '.join(data)}, not several", param=where)
    if data and data[0] not in allowed:
        raise unsupported_part(data[0], where, f"{' and '.join(allowed)} parts there")
    if not data:
        dropped.append(
            f"{where} {'/'.join(fields)} (a part with no text, call or response)"
            if fields
            else f"{where} (an empty part)"
        )
    return bool(data)


def _held_parts(
    parts: list[Mapping[str, Any]], where: str, allowed: tuple[str, ...], dropped: list[str]
) -> None:
    """Checks every part of a content (`_held`); one whose every part is left out is a 400."""
    left_out: list[str] = []
    held = [_held(part, f"{where}.parts[{p}]", allowed, left_out) for p, part in enumerate(parts)]
    if parts and not any(held):
        raise emptied_message(where, left_out)
    dropped.extend(left_out)


def _system_text(body: Mapping[str, Any], dropped: list[str]) -> str:
    system = _get(body, "systemInstruction", "system_instruction")
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    parts = []
    system = object_at(system, "systemInstruction")
    system_parts = objects_at(system.get("parts"), "systemInstruction.parts")
    _held_parts(system_parts, "systemInstruction", ("text",), dropped)
    for part in system_parts:
        if part.get("text"):
            parts.append(part["text"])
    return join_text(parts)


def _response_text(response: Any) -> str:
    return json.dumps(response if response is not None else {}, ensure_ascii=False)


def _convert_contents(contents: Any, dropped: list[str]) -> tuple[list[dict[str, Any]], int]:
    """Chat messages and the number of function calls seen (the next call's id index); each part
    left out (it holds nothing an engine can read) is named in `dropped`."""
    if not isinstance(contents, list) or not contents:
        raise DialectError(400, "contents: a non-empty list of contents is required", param="contents")
    out: list[dict[str, Any]] = []
    call_count = 0
    pending: list[tuple[str, str]] = []
    for c, content in enumerate(contents):
        where = f"contents[{c}]"
        if not isinstance(content, dict):
            raise DialectError(400, f"{where} must be an object", param=where)
        role = content.get("role") or "user"
        parts = objects_at(content.get("parts"), f"{where}.parts")
        allowed = ("text", "functionCall") if role == "model" else ("text", "functionResponse")
        _held_parts(parts, where, allowed, dropped)
        if role == "model":
            text, thoughts, calls = [], [], []
            for part in parts:
                call = _get(part, "functionCall", "function_call")
                if call is not None:
                    name = call.get("name") or ""
                    call_id = call.get("id") or f"call_{call_count}"
                    call_count += 1
                    pending.append((call_id, name))
                    calls.append(
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {
                                "name": name,
                                "arguments": current_memo().encode(name, call.get("args") or {}),
                            },
                        }
                    )
                elif part.get("thought") and part.get("text"):
                    thoughts.append(part["text"])
                elif part.get("text"):
                    text.append(part["text"])
            message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
            if thoughts:
                message["reasoning_content"] = "".join(thoughts)
            if calls:
                message["tool_calls"] = calls
            out.append(message)
            continue
        if role not in ("user", "function", "tool"):
            raise DialectError(
                400, f"{where}.role must be 'user' or 'model', got {role!r}", param=f"{where}.role"
            )
        texts: list[str] = []
        for part in parts:
            response = _get(part, "functionResponse", "function_response")
            if response is not None:
                if texts:
                    out.append({"role": "user", "content": join_text(texts)})
                    texts = []
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": _match_call(response, pending),
                        "content": _response_text(response.get("response")),
                    }
                )
            elif part.get("text") is not None:
                texts.append(part["text"])
        if texts or not parts:
            out.append({"role": "user", "content": join_text(texts)})
    return out, call_count


def _match_call(response: Mapping[str, Any], pending: list[tuple[str, str]]) -> str:
    """The id of the call a functionResponse answers: its own id, else the oldest open call by name."""
    wanted = response.get("id")
    name = response.get("name")
    for index, (call_id, call_name) in enumerate(pending):
        if (wanted and call_id == wanted) or (not wanted and call_name == name):
            del pending[index]
            return call_id
    return wanted or (pending.pop(0)[0] if pending else f"call_{name or 'unknown'}")


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def _convert_tools(tools: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Chat tools, and the built-in tools dropped (camelCase keys: `googleSearch`, `codeExecution`)."""
    out: list[dict[str, Any]] = []
    dropped: list[str] = []
    for t, tool in enumerate(objects_at(tools, "tools")):
        # googleSearch / codeExecution / urlContext / ... run at Google; a local engine cannot.
        dropped.extend(
            _camel(key)
            for key, value in tool.items()
            if value is not None and key not in ("functionDeclarations", "function_declarations")
        )
        for declaration in objects_at(
            _get(tool, "functionDeclarations", "function_declarations"), f"tools[{t}].functionDeclarations"
        ):
            parameters = _get(declaration, "parametersJsonSchema", "parameters_json_schema")
            if parameters is None:
                parameters = json_schema(declaration.get("parameters")) or {
                    "type": "object",
                    "properties": {},
                }
            function: dict[str, Any] = {"name": declaration.get("name") or "", "parameters": parameters}
            if declaration.get("description"):
                function["description"] = declaration["description"]
            out.append({"type": "function", "function": function})
    return out, dropped


def _convert_tool_choice(body: Mapping[str, Any], tool_names: list[str]) -> tuple[Any, str | None]:
    """The chat `tool_choice`, and what of the caller's restriction it cannot carry (or None)."""
    config = object_at(_get(body, "toolConfig", "tool_config"), "toolConfig")
    calling = object_at(
        _get(config, "functionCallingConfig", "function_calling_config"), "toolConfig.functionCallingConfig"
    )
    mode = str(calling.get("mode") or "").upper()
    allowed = list(
        strings_at(
            _get(calling, "allowedFunctionNames", "allowed_function_names"),
            "toolConfig.functionCallingConfig.allowedFunctionNames",
        )
    )
    if mode == "NONE":
        return "none", None
    if mode == "ANY" and len(allowed) == 1:
        return {"type": "function", "function": {"name": allowed[0]}}, None
    choice = "required" if mode == "ANY" else "auto" if mode in ("AUTO", "VALIDATED") else None
    return choice, loosened_tool_choice(
        "toolConfig.functionCallingConfig.allowedFunctionNames", allowed, tool_names
    )


class GoogleDialect:
    """Google Gemini generateContent / streamGenerateContent."""

    name: ClassVar[str] = "google"
    chat_field_names: ClassVar[Mapping[str, str]] = {
        "tool_choice": "toolConfig.functionCallingConfig.mode",
        "response_format": "generationConfig.responseMimeType",
        "max_tokens": "generationConfig.maxOutputTokens",
        "stop": "generationConfig.stopSequences",
        "n": "generationConfig.candidateCount",
    }
    sse_keepalive: ClassVar[bytes] = b"\n"
    """google-genai parses any non-`data:` line (an SSE comment too) as a JSON chunk and fails on
    `: keepalive`; a bare blank line is skipped by its parser and by every SSE parser."""

    def matches(self, path: str) -> bool:
        lowered = path.split("?", 1)[0].lower()
        return "generatecontent" in lowered or lowered.rstrip("/").endswith(":counttokens")

    def parse(self, body: Mapping[str, Any], path: str, query: Mapping[str, str]) -> DialectRequest:
        if not isinstance(body, Mapping):
            raise DialectError(400, "the request body must be a JSON object")
        if _get(body, "cachedContent", "cached_content") is not None:
            # Answered without it, the model would never see what the cache holds.
            raise DialectError(
                400,
                "cachedContent is not supported by tapdeck: cached content lives "
                "at Google; send its contents and systemInstruction in the request",
                param="cachedContent",
            )
        dropped_parts: list[str] = []
        messages, call_count = _convert_contents(body.get("contents"), dropped_parts)
        system = _system_text(body, dropped_parts)
        if system:
            messages.insert(0, {"role": "system", "content": system})
        model = model_from_path(path)
        chat: dict[str, Any] = {"model": model, "messages": messages}
        tools, dropped = _convert_tools(body.get("tools"))
        if tools:
            chat["tools"] = tools
            choice, loosened = _convert_tool_choice(body, [t["function"]["name"] for t in tools])
            if choice is not None:
                chat["tool_choice"] = choice
        config = object_at(_get(body, "generationConfig", "generation_config"), "generationConfig")
        candidates = _get(config, "candidateCount", "candidate_count")
        if isinstance(candidates, int) and candidates > 1:
            raise DialectError(
                400,
                "generationConfig.candidateCount > 1 is not supported: one candidate per call",
                param="generationConfig.candidateCount",
            )
        for camel, snake, key in (
            ("temperature", "temperature", "temperature"),
            ("topP", "top_p", "top_p"),
            ("topK", "top_k", "top_k"),
            ("maxOutputTokens", "max_output_tokens", "max_tokens"),
            ("seed", "seed", "seed"),
            ("presencePenalty", "presence_penalty", "presence_penalty"),
            ("frequencyPenalty", "frequency_penalty", "frequency_penalty"),
        ):
            value = _get(config, camel, snake)
            if value is not None:
                chat[key] = value
        stops = strings_at(_get(config, "stopSequences", "stop_sequences"), "generationConfig.stopSequences")
        if stops:
            chat["stop"] = list(stops)
        mime = _get(config, "responseMimeType", "response_mime_type")
        schema = _get(config, "responseJsonSchema", "response_json_schema") or json_schema(
            _get(config, "responseSchema", "response_schema")
        )
        if mime == "application/json":
            chat["response_format"] = (
                {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
                if schema
                else {"type": "json_object"}
            )
        stream = is_streaming(path, query)
        context: dict[str, Any] = {
            "call_base": call_count,
            "dropped_tools": dropped,
            "dropped_parts": dropped_parts,
            "object_arguments": True,
        }
        if tools and loosened:
            context["loosened_tool_choice"] = loosened
        if _get(config, "responseLogprobs", "response_logprobs") is True:
            top = config.get("logprobs")
            context["logprobs"] = top if type(top) is int and top > 0 else 0
            chat["logprobs"], chat["top_logprobs"] = True, context["logprobs"]
        if stream and not is_sse(query):
            context["stream_format"] = JSON_ARRAY
        return DialectRequest(chat=chat, stream=stream, client_model=model, context=context)

    # ---- replies -------------------------------------------------------------------------------

    @staticmethod
    def _parts(reply: ChatReply, request: DialectRequest) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = []
        if reply.reasoning:
            parts.append({"text": reply.reasoning, "thought": True})
        if reply.text:
            parts.append({"text": reply.text})
        base = int(request.context.get("call_base") or 0)
        for n, call in enumerate(reply.tool_calls):
            parts.append(
                {
                    "functionCall": {
                        "id": f"call_{base + n}",
                        "name": call.name,
                        "args": current_memo().decode(call.name, call.arguments),
                    }
                }
            )
        return parts

    @staticmethod
    def _finish(reply: ChatReply) -> str:
        return {"length": "MAX_TOKENS", "content_filter": "SAFETY"}.get(reply.finish_reason, "STOP")

    @staticmethod
    def _usage(reply: ChatReply) -> dict[str, Any]:
        usage = {
            "promptTokenCount": reply.prompt_tokens,
            "candidatesTokenCount": reply.completion_tokens,
            "totalTokenCount": reply.total_tokens,
        }
        if reply.reasoning_tokens:
            usage["thoughtsTokenCount"] = reply.reasoning_tokens
        if reply.cached_tokens:
            usage["cachedContentTokenCount"] = reply.cached_tokens
        return usage

    def _chunk(
        self,
        reply: ChatReply,
        request: DialectRequest,
        parts: list[dict[str, Any]],
        final: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        """One GenerateContentResponse; `final` (the engine's raw reply) for the last one, which
        carries finishReason, usage and the logprobs asked for."""
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        chunk: dict[str, Any] = {"candidates": [candidate]}
        if final is not None:
            candidate["finishReason"] = self._finish(reply)
            chunk["usageMetadata"] = self._usage(reply)
            if request.context.get("logprobs") is not None:
                candidate.update(_logprobs_result(final, request.context["logprobs"]))
        chunk["modelVersion"] = request.client_model or ""
        chunk["responseId"] = reply.id
        return chunk

    def render(self, reply: Mapping[str, Any], request: DialectRequest) -> dict[str, Any]:
        parsed = read_reply(reply)
        parts = self._parts(parsed, request) or [{"text": ""}]
        return self._chunk(parsed, request, parts, final=reply)

    def render_stream(self, reply: Mapping[str, Any], request: DialectRequest) -> Iterator[SSEEvent]:
        parsed = read_reply(reply)
        parts = self._parts(parsed, request) or [{"text": ""}]
        # One chunk per part; the last carries finishReason and usage (clients read both from it).
        for index, part in enumerate(parts):
            yield SSEEvent(
                data=self._chunk(parsed, request, [part], final=reply if index == len(parts) - 1 else None)
            )

    # ---- errors --------------------------------------------------------------------------------

    def error_body(self, status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
        fallback = "INVALID_ARGUMENT" if 400 <= status < 500 else "INTERNAL"
        return {"error": {"code": status, "message": message, "status": _STATUS.get(status, fallback)}}

    def stream_error(self, status: int, message: str, kind: str) -> Iterator[SSEEvent]:
        """A bare `{"error": ...}` chunk, not a `data:` event: the SDK gemini-cli bundles raises
        (with the status in `code`) only on a network chunk that parses as that object alone."""
        yield SSEEvent(data=self.error_body(status, message, kind), bare=True)


def _logprobs_result(reply: Mapping[str, Any], top: int) -> dict[str, Any]:
    """`avgLogprobs` and `logprobsResult` (each sampled token, and `top` alternatives per
    position) from the engine's per-token logprobs; nothing when the engine gave none."""
    choice = (reply.get("choices") or [{}])[0] or {}
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    if not isinstance(content, list) or not content:
        return {}
    entries = [e for e in content if isinstance(e, Mapping)]
    ids = choice.get("token_ids")
    chosen = [{"token": e.get("token") or "", "logProbability": e.get("logprob")} for e in entries]
    if isinstance(ids, list) and len(ids) == len(chosen):
        for candidate, token_id in zip(chosen, ids, strict=True):
            candidate["tokenId"] = token_id
    alternatives = [
        {
            "candidates": [
                {"token": a.get("token") or "", "logProbability": a.get("logprob")}
                for a in (e.get("top_logprobs") or [])[:top]
            ]
        }
        for e in entries
    ]
    total = sum(c["logProbability"] for c in chosen if isinstance(c["logProbability"], (int, float)))
    return {
        "avgLogprobs": total / len(chosen),
        "logprobsResult": {
            "topCandidates": alternatives,
            "chosenCandidates": chosen,
            "logProbabilitySum": total,
        },
    }


DIALECT = GoogleDialect()
