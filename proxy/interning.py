"""Content-addressed messages and tools: what a harness resends whole on every call, held once.

A harness resends its whole conversation (and tool list) on every call, so a rollout of k calls
carries O(k²) message copies. Each distinct message or tool gets a content key (sha256 of its
canonical JSON); a session holds one object per key, and the store writes each body once.

Keys cost a canonical dump and a sha256 per message. Only the messages the previous call did not
already send are keyed: the rest are matched to the previous call's by their exact JSON bytes, so
a call's keying costs what its new messages cost plus one cheap dump per old one.
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
        self._previous: dict[str, tuple[list[bytes], list[str]]] = {}

    def intern(self, request: dict[str, Any]) -> Interned:
        """`request` with its messages and tools replaced by this session's shared objects."""
        out = dict(request)
        keys: dict[str, list[str]] = {}
        for name in CONTENT_ADDRESSED:
            items = request.get(name)
            if not isinstance(items, list):
                continue
            exact = [orjson.dumps(item, option=_EXACT) for item in items]
            old_exact, old_keys = self._previous.get(name, ([], []))
            shared = common_prefix(exact, old_exact)
            names = old_keys[:shared] + [content_key(item) for item in items[shared:]]
            out[name] = [self.objects.setdefault(key, item) for key, item in zip(names, items)]
            keys[name] = names
            self._previous[name] = (exact, names)
        return Interned(out, keys)
