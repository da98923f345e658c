"""`/` search on the Rollout screen: each turn's own text, and which turns a query finds. Free of
Textual.

A turn's own text is what it added to the conversation: the messages of its prompt after the last
assistant message (what the agent was shown since its previous call; a first call's whole prompt)
and its reply. Every earlier message is in each later prompt too, so searching whole prompts would
find every turn after the first hit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tapdeck.app.views.tokens import message_text
from tapdeck.schema.sessions import RolloutTurn


def turn_text(request: Mapping[str, Any] | None, response: Mapping[str, Any] | None) -> str:
    """The turn's new prompt messages and its reply, as the Messages tab writes them."""
    messages = [m for m in (request or {}).get("messages") or [] if isinstance(m, Mapping)]
    last_reply = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    parts = [message_text(m) for m in messages[last_reply + 1 :]]
    if response:
        parts.append(message_text(response))
    return "\n".join(parts)


def turn_texts(turns: Iterable[RolloutTurn]) -> dict[int, str]:
    """Each turn's own text (lower-cased, for `find_turns`), by seq."""
    return {turn.seq: turn_text(turn.request, turn.response).lower() for turn in turns}


def find_turns(texts: Mapping[int, str], query: str) -> list[int]:
    """The seqs, in order, whose text holds every word of `query` (case-insensitive); none for an
    empty query."""
    words = query.lower().split()
    if not words:
        return []
    return sorted(seq for seq, text in texts.items() if all(word in text for word in words))


def search_line(query: str, found: list[int], at: int | None) -> str:
    """`/ pytest: turn 2 of 3 (#4)`, or that none holds it; "" with no query."""
    query = query.strip()
    if not query:
        return ""
    if not found:
        return f"/ {query}: no turn holds it"
    if at is None or at not in found:
        return f"/ {query}: {len(found)} turn{'s' if len(found) != 1 else ''}"
    return f"/ {query}: turn {found.index(at) + 1} of {len(found)} (#{at})"
