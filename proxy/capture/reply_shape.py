"""The shape every reader of a captured reply's message assumes.

The dialects render a turn's reply from its message, the graph hashes it, and the exports nest
its tool calls, all reading it as vLLM writes it (tests/fixtures/vllm/): an object whose
`content`, `reasoning`, `reasoning_content` and `role` are a string or null, and whose
`tool_calls` are null or a list of objects whose `function` is an object with a string `name`
and a string (or null) `arguments`, and whose `id` is a string or null.

`readable_message` names what in a message is not of that shape, and gives the message without
it. The engine boundary refuses a reply with any such fault (proxy/upstream/reply_check.py); a
turn an older tapdeck stored with one is read back without it, and with a WARN that says what was
left out (`readable_stored_reply`), so the exports and admin reads stay total over the store.
"""

from __future__ import annotations

from typing import Any

import orjson

from tapdeck.schema.findings import Finding

_TEXT_FIELDS = ("content", "reasoning", "reasoning_content", "role")
"""Message fields that are a string or null."""

_JSON_NAMES = {
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    list: "a list",
    dict: "an object",
    type(None): "null",
}


def shown(value: Any, limit: int = 60) -> str:
    """`value` for a message: its JSON type and the start of its JSON text."""
    kind = _JSON_NAMES.get(type(value), type(value).__name__)
    if value is None:
        return kind
    try:
        text = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    except (TypeError, orjson.JSONEncodeError):  # nested past what orjson writes
        text = "…"
    return f"{kind} ({text[:limit]}{'…' if len(text) > limit else ''})"


def _call_fault(call: Any, where: str) -> str | None:
    if type(call) is not dict:
        return f"`{where}` is {shown(call)}, not an object"
    fn = call.get("function")
    if type(fn) is not dict:
        return f"`{where}.function` is {shown(fn)}, not an object"
    name = fn.get("name")
    if type(name) is not str:
        return f"`{where}.function.name` is {shown(name)}, not a string"
    arguments = fn.get("arguments")
    if arguments is not None and type(arguments) is not str:
        return f"`{where}.function.arguments` is {shown(arguments)}, not a string"
    call_id = call.get("id")
    if call_id is not None and type(call_id) is not str:
        return f"`{where}.id` is {shown(call_id)}, not a string"
    return None


def readable_message(message: Any, where: str = "choices[0].message") -> tuple[dict[str, Any], list[str]]:
    """`message` without the fields no reader can take, and what each of them was.

    A message of the right shape is returned as it is (no copy): the faults are empty."""
    if type(message) is not dict:
        return {}, [f"`{where}` is {shown(message)}, not an object"]
    faults: list[str] = []
    out = message
    for key in _TEXT_FIELDS:
        value = message.get(key)
        if value is not None and type(value) is not str:
            faults.append(f"`{where}.{key}` is {shown(value)}, not a string or null")
            out = dict(out) if out is message else out
            del out[key]
    calls = message.get("tool_calls")
    if calls is not None:
        if type(calls) is not list:
            faults.append(f"`{where}.tool_calls` is {shown(calls)}, not a list")
            out = dict(out) if out is message else out
            del out["tool_calls"]
        else:
            kept = []
            for i, call in enumerate(calls):
                fault = _call_fault(call, f"{where}.tool_calls[{i}]")
                if fault is None:
                    kept.append(call)
                else:
                    faults.append(fault)
            if len(kept) != len(calls):
                out = dict(out) if out is message else out
                out["tool_calls"] = kept
    return out, faults


def readable_stored_reply(response: Any, seq: int) -> tuple[dict[str, Any], list[Finding]]:
    """A stored turn's reply message as every reader takes it, and a WARN naming what was left
    out of it (an older tapdeck stored replies it did not check). Its finish reason needs no such
    care: the store's text column gives back a string or null whatever was bound to it."""
    message, faults = readable_message(response, "response")
    if not faults:
        return message, []
    return message, [
        Finding.warn(
            "stored_reply_malformed",
            f"the stored reply is not of the shape tapdeck reads, so these "
            f"were left out of it: {'; '.join(faults)}",
            seq,
        )
    ]


__all__ = ["readable_message", "readable_stored_reply", "shown"]
