"""Messages compared as canonical bytes: for calls without ids and for re-tokenisation checks.

A conversation is hashed message by message (`chain_hashes`), so "this request continues that
node's conversation" is one hash comparison.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson


def _canon_args(args: Any) -> str:
    if isinstance(args, str):
        text = args
        try:
            args = orjson.loads(text)
        except orjson.JSONDecodeError:
            return text
    return orjson.dumps(args, option=orjson.OPT_SORT_KEYS).decode()


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
            else:
                parts.append(orjson.dumps(part, option=orjson.OPT_SORT_KEYS).decode())
        return "".join(parts)
    return orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode()


def normalize_message(msg: dict[str, Any]) -> bytes:
    """Canonical bytes of a message for prefix comparison.

    Compares role, text and tool calls (name + canonical JSON arguments). Ignores `refusal`,
    `annotations`, `audio`, ids and the like; null and "" are the same; a role-less reply is the
    assistant's.
    """
    role = msg.get("role") or "assistant"
    calls: list[Any] = []
    tool_calls = msg.get("tool_calls") or []
    # A lenient engine may have answered a request whose tool calls are not objects: they are
    # compared as their JSON (a strict one refuses such a request before it becomes a turn).
    for tc in tool_calls if isinstance(tool_calls, list) else [tool_calls]:
        if not isinstance(tc, dict):
            calls.append(orjson.dumps(tc, option=orjson.OPT_SORT_KEYS).decode())
            continue
        fn = tc.get("function")
        if not isinstance(fn, dict):
            fn = tc
        calls.append([fn.get("name") or "", _canon_args(fn.get("arguments"))])
    if isinstance(msg.get("function_call"), dict):
        fc = msg["function_call"]
        calls.append([fc.get("name") or "", _canon_args(fc.get("arguments"))])
    return orjson.dumps([role, _text(msg.get("content")), calls])


def conversation(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's messages without the leading system/developer messages."""
    msgs = [m for m in (request.get("messages") or []) if isinstance(m, dict)]
    start = 0
    while start < len(msgs) and msgs[start].get("role") in ("system", "developer"):
        start += 1
    return msgs[start:]


def system_prompt(request: dict[str, Any]) -> list[bytes]:
    """The request's leading system/developer messages, canonical (what `conversation` skips)."""
    msgs = [m for m in (request.get("messages") or []) if isinstance(m, dict)]
    return [normalize_message(m) for m in msgs[: len(msgs) - len(conversation(request))]]


def _chain(prev: bytes, msg: dict[str, Any]) -> bytes:
    return hashlib.blake2b(prev + normalize_message(msg), digest_size=16).digest()


def chain_hashes(msgs: list[dict[str, Any]], start: bytes = b"") -> list[bytes]:
    out, h = [], start
    for m in msgs:
        h = _chain(h, m)
        out.append(h)
    return out
