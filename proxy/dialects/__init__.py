"""Wire dialects: each translates its requests to chat-completions and replies back.

Registry: `DIALECTS` (first match wins) and `detect(path)`. A dialect module defines one
module-level instance named `DIALECT`; registering it is adding it to `DIALECTS`.
"""

from __future__ import annotations

from tapdeck.proxy.dialects import anthropic, chat, google, responses
from tapdeck.proxy.dialects.base import Dialect

DIALECTS: list[Dialect] = [chat.DIALECT, responses.DIALECT, anthropic.DIALECT, google.DIALECT]
"""In detection order."""


def detect(path: str) -> Dialect | None:
    """The dialect a model-call path belongs to (case-insensitive), or None."""
    for dialect in DIALECTS:
        if dialect.matches(path):
            return dialect
    return None
