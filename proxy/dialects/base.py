"""The contract every wire dialect implements.

A dialect turns its own request body into a chat-completions request (the proxy's one internal
form), and turns the proxy's chat-completions reply back into its own response body or SSE event
sequence. Upstream is always called without streaming; streams are synthesised from the full reply.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from tapdeck.proxy.errors import DialectError

__all__ = ["Dialect", "DialectError", "DialectRequest", "SSEEvent", "object_at", "objects_at", "strings_at"]


def strings_at(value: Any, where: str) -> list[str]:
    """A list-of-strings field (stop sequences), or a 400 naming it: a bare string would
    otherwise be read as one stop sequence per character."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DialectError(400, f"{where} must be a list of strings", param=where)
    return value


def loosened_tool_choice(where: str, allowed: list[str], tool_names: list[str]) -> str | None:
    """What a tool choice limited to `allowed` of the request's `tool_names` loses as chat's
    `tool_choice`, which forces one named tool or any tool but never a subset; None if nothing."""
    if not allowed or set(tool_names) <= set(allowed):
        return None
    return (
        f"{where} limits calls to {', '.join(allowed)}; the engine can force one named tool or "
        f"any tool, not a subset, so this call could call any of its {len(tool_names)} tools"
    )


def unsupported_part(kind: Any, where: str, translated: str) -> DialectError:
    """A 400 for a content part the translation has no place for: dropped, it would leave the
    model answering without what it held, and nothing would say so."""
    return DialectError(
        400,
        f"{where}: content of type {kind!r} is not supported here (tapdeck "
        f"translates {translated}); it is refused rather than dropped, so the "
        "model never answers without it",
        param=where,
    )


def emptied_message(where: str, left_out: list[str]) -> DialectError:
    """A 400 for a message whose every part is one the translation leaves out: sent empty, or left
    out, it would change the conversation (a user turn gone makes the prompt end on an assistant
    message, which the engine would continue as a prefill)."""
    return DialectError(
        400,
        f"{where}: tapdeck leaves out {'; '.join(left_out)}, and nothing else is in "
        "the message: it would reach the model empty, so it is refused (send its "
        "content as text)",
        param=where,
    )


def object_at(value: Any, where: str) -> Mapping[str, Any]:
    """An optional object field (`{}` when absent), or a 400 naming it."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DialectError(400, f"{where} must be an object", param=where)
    return value


def objects_at(value: Any, where: str) -> list[Mapping[str, Any]]:
    """An optional list-of-objects field (`[]` when absent), or a 400 naming the bad entry."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise DialectError(400, f"{where} must be a list of objects", param=where)
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise DialectError(400, f"{where}[{i}] must be an object", param=f"{where}[{i}]")
    return value


@dataclass
class DialectRequest:
    """A harness request, normalised."""

    chat: dict[str, Any]
    """The chat-completions request body to send upstream (before the engine client forces capture
    fields): `messages`, `tools`, sampling parameters, `max_tokens`, `stop`, ..."""
    stream: bool
    """The caller wants SSE in its own dialect."""
    client_model: str | None
    """The model name the caller asked for; replies show it back."""
    context: dict[str, Any] = field(default_factory=dict)
    """Anything the dialect needs later to render the reply (ids, requested output shape)."""


@dataclass(frozen=True)
class SSEEvent:
    """One server-sent event. `data` is JSON-encoded unless it is already a string (`[DONE]`)."""

    data: Mapping[str, Any] | str
    event: str | None = None
    bare: bool = False
    """Written as the JSON alone, not as a `data:` field: Google's SDKs raise an error only on a
    network chunk that parses as `{"error": ...}` by itself, not on an SSE event carrying one."""


class Dialect(Protocol):
    """One wire dialect (chat-completions, Responses, Anthropic Messages, Google generateContent)."""

    name: ClassVar[str]
    chat_field_names: ClassVar[Mapping[str, str]]
    """The caller's own name for a chat-completions field its request is translated into, where it
    differs: an error about that field (`ProxyError.param`) names what the caller sent."""

    def matches(self, path: str) -> bool:
        """Whether a model-call path belongs to this dialect (compare case-insensitively)."""
        ...

    def parse(self, body: Mapping[str, Any], path: str, query: Mapping[str, str]) -> DialectRequest:
        """Translate a request; raise DialectError for one the proxy must refuse."""
        ...

    def render(self, reply: Mapping[str, Any], request: DialectRequest) -> dict[str, Any]:
        """The non-streaming response body for a chat-completions reply."""
        ...

    def render_stream(self, reply: Mapping[str, Any], request: DialectRequest) -> Iterator[SSEEvent]:
        """The full SSE event sequence for a chat-completions reply, terminator included."""
        ...

    def error_body(self, status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
        """This dialect's error envelope."""
        ...

    def stream_error(self, status: int, message: str, kind: str) -> Iterator[SSEEvent]:
        """The error as this dialect's SSE events (a stream never gets a JSON body)."""
        ...
