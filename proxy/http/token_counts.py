"""Auxiliary routes answered without becoming a turn: Anthropic and Google token counts.

`POST /v1/messages/count_tokens` → `{"input_tokens": N}`; `POST .../models/{m}:countTokens` →
`{"totalTokens": N}`. N is the engine's own count when it offers vLLM's `/tokenize` (the request is
translated by its dialect, so the count is of the prompt the engine would render), otherwise an
estimate of about four characters per token over every text field of the request (contents, system
instruction, messages, system, tools). A count call is never recorded and never adds a graph node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import httpx

from tapdeck.proxy.dialects.anthropic import DIALECT as ANTHROPIC
from tapdeck.proxy.dialects.base import Dialect, DialectError
from tapdeck.proxy.dialects.google import DIALECT as GOOGLE

AuxKind = Literal["anthropic_count_tokens", "google_count_tokens"]

_CHARS_PER_TOKEN = 4
_TOKENIZE_TIMEOUT = httpx.Timeout(10.0, connect=3.0)
# Values that are protocol plumbing, not text the model reads.
_SKIPPED_KEYS = frozenset(
    {
        "type",
        "role",
        "id",
        "tool_use_id",
        "cache_control",
        "signature",
        "thoughtSignature",
        "thought_signature",
        "mimeType",
        "mime_type",
        "data",
        "model",
    }
)
_no_tokenize: set[str] = set()
"""`/tokenize` URLs that answered 404/405: counts for their engine are estimated, until
`forget_engine` (the engine refused connections, and may come back with other flags)."""


def match_aux(method: str, path: str) -> AuxKind | None:
    """Which aux route a request is, if any (paths compared case-insensitively)."""
    if method.upper() != "POST":
        return None
    lowered = path.split("?", 1)[0].lower().rstrip("/")
    if lowered.endswith("/messages/count_tokens"):
        return "anthropic_count_tokens"
    if lowered.endswith(":counttokens"):
        return "google_count_tokens"
    return None


def aux_dialect(kind: AuxKind) -> Dialect:
    """The dialect whose envelope an aux route answers in (errors such as 401 for an unknown key)."""
    return ANTHROPIC if kind == "anthropic_count_tokens" else GOOGLE


def forget_engine(engine_url: str) -> None:
    """Ask this engine's `/tokenize` again on its next count (it refused connections: a restarted
    engine may serve it now)."""
    _no_tokenize.discard(tokenize_url(engine_url))


def _request_fields(kind: AuxKind, body: Mapping[str, Any]) -> dict[str, Any]:
    if kind == "anthropic_count_tokens":
        return {key: body.get(key) for key in ("system", "messages", "tools")}
    nested = body.get("generateContentRequest") or body.get("generate_content_request") or {}
    fields = {}
    for key in ("contents", "systemInstruction", "system_instruction", "tools"):
        value = body.get(key)
        fields[key] = value if value is not None else nested.get(key)
    return fields


def _chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(len(str(k)) + _chars(v) for k, v in value.items() if k not in _SKIPPED_KEYS)
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return len(str(value))
    return 0


def _text_chars(value: Any, *, keys_count: bool) -> int:
    """Characters of text; inside tool arguments/schemas the keys are text the model reads too."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_chars(v, keys_count=keys_count) for v in value)
    if not isinstance(value, Mapping):
        return _chars(value) if keys_count else 0
    total = 0
    for key, inner in value.items():
        if key in _SKIPPED_KEYS:
            continue
        if key in (
            "input",
            "args",
            "response",
            "input_schema",
            "parameters",
            "parametersJsonSchema",
            "parameters_json_schema",
        ):
            total += _chars(inner)
        else:
            total += (len(str(key)) if keys_count else 0) + _text_chars(inner, keys_count=keys_count)
    return total


def estimate_tokens(kind: AuxKind, body: Mapping[str, Any]) -> int:
    """≈ chars/4 over every text field of a count request (0 only when it holds no text at all)."""
    chars = sum(_text_chars(value, keys_count=False) for value in _request_fields(kind, body).values())
    return math.ceil(chars / _CHARS_PER_TOKEN)


def tokenize_url(engine_url: str) -> str:
    """vLLM serves `/tokenize` at the server root, beside (not under) `/v1`."""
    root = engine_url.rstrip("/")
    return root.removesuffix("/v1") + "/tokenize"


def _chat_for_count(kind: AuxKind, body: Mapping[str, Any]) -> dict[str, Any] | None:
    fields = {k: v for k, v in _request_fields(kind, body).items() if v is not None}
    try:
        if kind == "anthropic_count_tokens":
            return ANTHROPIC.parse(fields, "/v1/messages", {}).chat
        return GOOGLE.parse(fields, "/v1beta/models/m:generateContent", {}).chat
    except DialectError:
        return None


async def _engine_count(
    url: str, chat: dict[str, Any], served_model: str | None, api_key: str | None, client: httpx.AsyncClient
) -> int | None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    payload: dict[str, Any] = {"messages": chat["messages"], "add_generation_prompt": True}
    if served_model:
        payload["model"] = served_model
    attempts = [payload | {"tools": chat["tools"]}, payload] if chat.get("tools") else [payload]
    for attempt in attempts:
        try:
            response = await client.post(url, json=attempt, headers=headers, timeout=_TOKENIZE_TIMEOUT)
        except httpx.HTTPError:
            return None
        if response.status_code in (404, 405):
            _no_tokenize.add(url)
            return None
        if response.status_code == 200:
            try:
                reply = response.json()
            except ValueError:
                return None
            count = reply.get("count")
            if isinstance(count, int) and count >= 0:
                return count
            tokens = reply.get("tokens")
            return len(tokens) if isinstance(tokens, list) else None
    return None


async def count_tokens(
    kind: AuxKind,
    body: Mapping[str, Any],
    *,
    engine_url: str | None,
    served_model: str | None = None,
    api_key: str | None = None,
    client: httpx.AsyncClient | None = None,
) -> tuple[dict[str, Any], str]:
    """The aux reply body and how it was counted (`"engine"` or `"estimate"`)."""
    if not isinstance(body, Mapping):
        raise DialectError(400, "the request body must be a JSON object")
    count: int | None = None
    if engine_url:
        url = tokenize_url(engine_url)
        chat = _chat_for_count(kind, body) if url not in _no_tokenize else None
        if chat is not None:
            if client is None:
                async with httpx.AsyncClient() as own:
                    count = await _engine_count(url, chat, served_model, api_key, own)
            else:
                count = await _engine_count(url, chat, served_model, api_key, client)
    method = "engine" if count is not None else "estimate"
    if count is None:
        count = estimate_tokens(kind, body)
    if kind == "anthropic_count_tokens":
        return {"input_tokens": count}, method
    return {"totalTokens": count}, method
