"""Content-addressed messages and tools: what a harness resends whole on every call, held once.

A harness resends its whole conversation (and tool list) on every call, so a rollout of k calls
carries O(k²) message copies. Each distinct message or tool gets a content key (sha256 of its
canonical JSON); a session holds one object per key, and the store writes each body once.

Keys cost a canonical dump and a sha256 per message. Only the messages the previous call did not
already send are keyed. A call that extends the previous one is recognised from one dump of its
whole list: its JSON starts with the previous list's JSON (less the closing bracket) followed by a
comma or the bracket, so those leading messages are, byte for byte, the previous ones (a JSON value
ends where it ends). Any other call is matched message by message against the previous call's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

CONTENT_ADDRESSED = ("messages", "tools")
"""Request lists a harness resends whole on every call; their elements are content-addressed."""

_CANONICAL = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
_EXACT = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def content_key(obj: Any) -> str:
    """The content key of a message or tool: sha256 (hex) of its canonical JSON (keys sorted).

    Equal messages get equal keys whatever their key order.
    """
    return hashlib.sha256(orjson.dumps(obj, option=_CANONICAL)).hexdigest()


def common_prefix(a: list[Any], b: list[Any]) -> int:
    """How many leading elements `a` and `b` share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


@dataclass
class Interned:
    """A request with its content-addressed lists replaced by shared objects, and their keys."""

    request: dict[str, Any]
    keys: dict[str, list[str]]


class Interner:
    """One session's distinct messages and tools, and the previous call's lists.

    Not thread-safe: a session interns one call at a time (under its capture lock).
    """

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}
        """Content key -> the first object seen with it (shared by every turn's request)."""
        self._previous: dict[str, _Sent] = {}

    def intern(self, request: dict[str, Any]) -> Interned:
        """`request` with its messages and tools replaced by this session's shared objects."""
        out = dict(request)
        keys: dict[str, list[str]] = {}
        for name in CONTENT_ADDRESSED:
            items = request.get(name)
            if not isinstance(items, list):
                continue
            whole = orjson.dumps(items, option=_EXACT)
            before = self._previous.get(name)
            shared = 0 if before is None else self._shared(items, whole, before)
            old_keys, old_objects = (before.keys, before.objects) if before else ([], [])
            new_keys = [content_key(item) for item in items[shared:]]
            objects = old_objects[:shared] + [
                self.objects.setdefault(key, item) for key, item in zip(new_keys, items[shared:], strict=True)
            ]
            out[name] = objects
            keys[name] = old_keys[:shared] + new_keys
            self._previous[name] = _Sent(whole, keys[name], objects)
        return Interned(out, keys)

    def _shared(self, items: list[Any], whole: bytes, before: _Sent) -> int:
        """How many leading `items` are, byte for byte, the ones the previous call sent."""
        head = before.json[:-1]  # `[a,b` of `[a,b]`
        if before.keys and whole.startswith(head) and whole[len(head) : len(head) + 1] in (b",", b"]"):
            return len(before.keys)
        shared = 0
        for item, sent in zip(items, before.objects, strict=False):
            if orjson.dumps(item, option=_EXACT) != orjson.dumps(sent, option=_EXACT):
                break
            shared += 1
        return shared


@dataclass
class _Sent:
    """What the previous call sent in one list: its JSON, its keys and the shared objects."""

    json: bytes
    keys: list[str]
    objects: list[Any]
