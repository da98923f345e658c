"""Tool-call arguments: object-valued dialects (Anthropic `input`, Google `args`) versus chat strings.

Anthropic and Google carry a tool call's arguments as a JSON object; chat carries the exact string
the model sampled. Re-serialising the object on the next request (`{"a": 1}` vs `{"a":1}`) would
render different prompt tokens than the engine produced, and the conversation would stop extending
its own prefix. So when a reply is rendered, the sampled string is remembered under (tool name,
canonical JSON of the object), and the next request's object is turned back into that string.

Arguments the model sampled that are not a JSON object (a parser that passes raw text through, a
call cut short) reach such a client as `{}`: that is remembered too, so the `{}` it resends renders
as what was sampled, and the turn gets a finding saying what the agent was handed instead.

The memo is per capture session (the service installs the session's with `arguments_memo` around
parsing and rendering): GRPO siblings sample different strings for the same object, and one
sibling's string must never re-render another's history.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from tapdeck.proxy.dialects.reply import read_reply
from tapdeck.schema.findings import Finding

_CAPACITY = 8192


def canonical_json(value: Any) -> str:
    """A key-order-independent JSON text for `value`."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class ArgumentsMemo:
    """Bounded LRU map (tool name, canonical arguments) → the arguments string the engine sampled."""

    def __init__(self, capacity: int = _CAPACITY) -> None:
        self._capacity = capacity
        self._items: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()

    def decode(self, name: str, arguments: str | None) -> dict[str, Any]:
        """The object form of a sampled arguments string, `{}` when it is not an object; either
        way remembered as standing for that string."""
        value = as_object(arguments)
        self.remember(name, {} if value is None else value, arguments or "{}")
        return {} if value is None else value

    def remember(self, name: str, value: Any, sampled: str) -> None:
        """Record that `value` was sampled as the text `sampled`."""
        key = (name, canonical_json(value))
        with self._lock:
            self._items[key] = sampled
            self._items.move_to_end(key)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)

    def encode(self, name: str, value: Any) -> str:
        """The chat arguments string for an object: the sampled text when known, else compact-spaced JSON."""
        key = (name, canonical_json(value))
        with self._lock:
            sampled = self._items.get(key)
        if sampled is not None:
            return sampled
        return json.dumps(value, ensure_ascii=False)


def as_object(arguments: str | None) -> dict[str, Any] | None:
    """A sampled arguments string as a JSON object (`{}` for none); None when it is not one."""
    try:
        value = json.loads(arguments) if arguments else {}
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def not_object_findings(reply: Mapping[str, Any]) -> list[Finding]:
    """A WARN per tool call of `reply` whose sampled arguments are not a JSON object, for a call
    whose client takes arguments as objects (it is handed `{}` for them)."""
    return [
        Finding.warn(
            "tool_arguments_not_object",
            f"tool call {i} ({call.name}): the sampled arguments are not a JSON object, "
            f"so the agent was handed {{}} for {call.arguments[:80]!r}; resent, the "
            "call renders as sampled",
        )
        for i, call in enumerate(read_reply(reply).tool_calls)
        if as_object(call.arguments) is None
    ]


_CURRENT: ContextVar[ArgumentsMemo | None] = ContextVar("tapdeck_arguments_memo", default=None)
_UNSCOPED = ArgumentsMemo()
"""Used only by a dialect called outside any session (its own unit tests, offline tools)."""


def current_memo() -> ArgumentsMemo:
    """The memo of the session whose call is being parsed or rendered."""
    return _CURRENT.get() or _UNSCOPED


@contextlib.contextmanager
def arguments_memo(memo: ArgumentsMemo) -> Iterator[ArgumentsMemo]:
    """Parse and render with `memo` as the current one inside the block."""
    token = _CURRENT.set(memo)
    try:
        yield memo
    finally:
        _CURRENT.reset(token)
