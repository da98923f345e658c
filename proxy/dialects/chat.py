"""OpenAI chat-completions: the proxy's internal form, so translation is mostly normalisation.

Requests: the leading system and `developer` messages fold into one leading system message (one
template rendering, one stable prompt prefix); later ones stay in place as `system` messages. Replies: the
client's model name back, usage details zero-filled, capture fields the client did not ask for removed.
Streams are synthesised from the full reply as the chunk sequence OpenAI's SDKs expect, ending in `data:
[DONE]`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import repeat
from typing import Any, ClassVar

from tapdeck.proxy.dialects.base import DialectError, DialectRequest, SSEEvent
from tapdeck.proxy.upstream.client import zero_filled_usage

DONE = SSEEvent(data="[DONE]")
SYSTEM_ROLES = ("system", "developer")


def merge_system_messages(messages: list[Any], roles: list[Any] | None = None) -> list[Any]:
    """One leading system message from the leading run of system/`developer` messages; later ones
    stay where the agent put them, as `system` messages.

    Folding a mid-conversation system message (claude-code's reminders, a developer message after
    the first turn) into the leading one would change the prompt's start, and the conversation
    would no longer extend its own prefix. Text joins with a blank line; if any part is not text
    the merged content is a list of parts with every part kept. The list is returned unchanged
    when it already has that shape. `roles` are the messages' `roles_of`, when known.
    """
    if roles is None:
        roles = roles_of(messages)
    lead = 0
    while lead < len(roles) and roles[lead] in SYSTEM_ROLES:
        lead += 1
    single = lead == 0 or (lead == 1 and roles[0] == "system")
    if "developer" not in roles[lead:]:
        return messages if single else [_merged(messages[:lead]), *messages[lead:]]
    rest = [
        {**m, "role": "system"} if r == "developer" else m
        for m, r in zip(messages[lead:], roles[lead:], strict=True)
    ]
    return [*messages[:lead], *rest] if single else [_merged(messages[:lead]), *rest]


def roles_of(messages: list[Any]) -> list[Any]:
    """Each message's `role` (None for one that is not an object), in one pass: every model call
    resends its whole conversation, so per-message checks here run on every message of every call."""
    return [m.get("role") if type(m) is dict else _role(m) for m in messages]


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, Mapping) else None


def fold_system_messages(messages: list[Any]) -> list[Any]:
    """Every system/`developer` message folded into one leading system message, for an engine
    whose chat template refuses system messages after the first turn."""
    system = [m for m in messages if _is_system(m)]
    if not system or (len(system) == 1 and messages[0] is system[0] and system[0].get("role") == "system"):
        return messages
    return [_merged(system), *(m for m in messages if not _is_system(m))]


def has_late_system(messages: list[Any]) -> bool:
    """Whether a system/`developer` message follows a message of another role."""
    seen_other = False
    for m in messages:
        if _is_system(m):
            if seen_other:
                return True
        else:
            seen_other = True
    return False


def _is_system(message: Any) -> bool:
    return isinstance(message, Mapping) and message.get("role") in SYSTEM_ROLES


def _merged(system: list[Mapping[str, Any]]) -> dict[str, Any]:
    contents = [m.get("content") for m in system]
    if all(isinstance(c, str) or c is None for c in contents):
        merged: str | list[Any] = "\n\n".join(c for c in contents if c)
    else:
        parts: list[Any] = []
        for c in contents:
            if isinstance(c, str):
                if c:
                    parts.append({"type": "text", "text": c})
            elif isinstance(c, list):
                parts.extend(c)
            elif c is not None:
                parts.append(c)  # kept for the engine to render or refuse, never dropped
        merged = parts
    out: dict[str, Any] = {"role": "system", "content": merged}
    names = {m.get("name") for m in system} - {None}
    if len(names) == 1:
        out["name"] = names.pop()
    return out


class ChatDialect:
    """`POST /v1/chat/completions` (and `/chat/completions` without the version prefix)."""

    name: ClassVar[str] = "chat"
    chat_field_names: ClassVar[Mapping[str, str]] = {}

    def matches(self, path: str) -> bool:
        """Case-insensitive; any prefix (`/v1`, `/openai/v1`, none)."""
        return path.split("?", 1)[0].rstrip("/").lower().endswith("/chat/completions")

    def parse(self, body: Mapping[str, Any], path: str, query: Mapping[str, str]) -> DialectRequest:
        """Validate and normalise a chat request; the caller's body is not mutated."""
        if not isinstance(body, Mapping):
            raise DialectError(400, "the request body must be a JSON object")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise DialectError(400, "`messages` must be a non-empty array", param="messages")
        roles = roles_of(messages)
        if not all(map(isinstance, roles, repeat(str))):
            raise DialectError(400, "every message must be an object with a `role`", param="messages")
        n = body.get("n")
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n > 1):
            raise DialectError(
                400, f"n={n!r} is not supported: the capture proxy records one completion per call", param="n"
            )
        model = body.get("model")
        chat = dict(body)
        chat["messages"] = merge_system_messages(messages, roles)
        stream = body.get("stream") is True
        options = body.get("stream_options")
        context = {
            "include_usage": stream and isinstance(options, Mapping) and options.get("include_usage") is True,
            "logprobs": body.get("logprobs") is True,
            "top_logprobs": body.get("top_logprobs"),
            "return_token_ids": body.get("return_token_ids") is True,
        }
        return DialectRequest(
            chat=chat, stream=stream, client_model=model if isinstance(model, str) else None, context=context
        )

    def render(self, reply: Mapping[str, Any], request: DialectRequest) -> dict[str, Any]:
        """The reply as the client would get it from the engine directly, under its own model name."""
        out = dict(reply)
        out.pop("tapdeck_synthetic", None)  # the proxy's own mark on a stop it made up
        if request.client_model:
            out["model"] = request.client_model
        out["usage"] = zero_filled_usage(reply.get("usage"))
        ctx = request.context
        if not ctx.get("return_token_ids"):
            out.pop("prompt_token_ids", None)
        choices = []
        for choice in reply.get("choices") or []:
            choice = dict(choice)
            if not ctx.get("return_token_ids"):
                choice.pop("token_ids", None)
                choice.pop("prompt_token_ids", None)
            if not ctx.get("logprobs"):
                choice["logprobs"] = None
            elif isinstance(choice.get("logprobs"), Mapping):
                asked = ctx.get("top_logprobs")
                choice["logprobs"] = _alternatives_cut(choice["logprobs"], asked if type(asked) is int else 0)
            choices.append(choice)
        out["choices"] = choices
        return out

    def render_stream(self, reply: Mapping[str, Any], request: DialectRequest) -> Iterator[SSEEvent]:
        """role chunk, reasoning, content, tool-call deltas, finish chunk, usage chunk (if
        `stream_options.include_usage`), `[DONE]`."""
        full = self.render(reply, request)
        include_usage = bool(request.context.get("include_usage"))
        head = {
            "id": full.get("id") or "chatcmpl-tapdeck",
            "object": "chat.completion.chunk",
            "created": full.get("created") or 0,
            "model": full.get("model"),
            "system_fingerprint": full.get("system_fingerprint"),
        }
        choice = (full.get("choices") or [{}])[0]
        message = choice.get("message") or {}

        def chunk_body(delta: dict[str, Any], *, finish: str | None = None, **extra: Any) -> dict[str, Any]:
            c: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            c.update(extra)
            body: dict[str, Any] = {**head, "choices": [c]}
            if include_usage:
                body["usage"] = None
            return body

        def chunk(delta: dict[str, Any], *, finish: str | None = None, **extra: Any) -> SSEEvent:
            return SSEEvent(data=chunk_body(delta, finish=finish, **extra))

        first: dict[str, Any] = {"role": "assistant", "content": ""}
        if "prompt_token_ids" in full:
            yield SSEEvent(data={**chunk_body(first), "prompt_token_ids": full["prompt_token_ids"]})
        else:
            yield chunk(first)
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        if reasoning:
            yield chunk({"reasoning": reasoning, "reasoning_content": reasoning})
        content = message.get("content")
        extra: dict[str, Any] = {}
        if choice.get("logprobs") is not None:
            extra["logprobs"] = choice["logprobs"]
        if "token_ids" in choice:
            extra["token_ids"] = choice["token_ids"]
        if content or extra:
            yield chunk({"content": content or ""}, **extra)
        for i, call in enumerate(message.get("tool_calls") or []):
            fn = call.get("function") or {}
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": call.get("id"),
                            "type": "function",
                            "function": {"name": fn.get("name"), "arguments": ""},
                        }
                    ]
                }
            )
            if fn.get("arguments"):
                yield chunk({"tool_calls": [{"index": i, "function": {"arguments": fn["arguments"]}}]})
        yield chunk({}, finish=choice.get("finish_reason") or "stop")
        if include_usage:
            yield SSEEvent(data={**head, "choices": [], "usage": full["usage"]})
        yield DONE

    def error_body(self, status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
        """`{"error": {message, type, param, code}}`, as OpenAI and vLLM send it."""
        return {"error": {"message": message, "type": kind, "param": param, "code": status}}

    def stream_error(self, status: int, message: str, kind: str) -> Iterator[SSEEvent]:
        """One `data:` event with the error envelope, then `[DONE]` (OpenAI SDKs raise on it)."""
        yield SSEEvent(data=self.error_body(status, message, kind))
        yield DONE


def _alternatives_cut(logprobs: Mapping[str, Any], asked: int) -> dict[str, Any]:
    """Each `top_logprobs` cut to the `asked` alternatives the client wanted (the proxy may have
    asked the engine for more, to capture them)."""
    content = logprobs.get("content")
    if not isinstance(content, list):
        return dict(logprobs)
    return {
        **logprobs,
        "content": [
            {**e, "top_logprobs": (e.get("top_logprobs") or [])[: max(asked, 0)]}
            if isinstance(e, Mapping)
            else e
            for e in content
        ],
    }


DIALECT = ChatDialect()
