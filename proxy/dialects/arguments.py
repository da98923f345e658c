"""Tool-call arguments: object-valued dialects (Anthropic `input`, Google `args`) versus chat strings.

Anthropic and Google carry a tool call's arguments as a JSON object; chat carries the exact string
the model sampled. Re-serialising the object on the next request (`{"a": 1}` vs `{"a":1}`) would
render different prompt tokens than the engine produced, and the conversation would stop extending
its own prefix. So when a reply is rendered, the sampled string is remembered under (tool name,
canonical JSON of the object), and the next request's object is turned back into that string.

The memo is per capture session (the service installs the session's with `arguments_memo` around
parsing and rendering): GRPO siblings sample different strings for the same object, and one
sibling's string must never re-render another's history.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

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
        """The object form of a sampled arguments string (remembered); `{}` when it is not an object."""
        try:
            value = json.loads(arguments) if arguments else {}
        except (TypeError, ValueError):
            return {}
        if not isinstance(value, dict):
            return {}
        self.remember(name, value, arguments or "{}")
        return value

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
