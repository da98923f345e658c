"""A turn's sampled tokens and messages as the Rollout screen shows them: each token's colour class
by logprob, its text made visible, its detail line."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tapdeck.schema.sessions import TurnDetail


def logprob_tone(logprob: float | None, masked: bool) -> str:
    """Colour class of one sampled token: masked, or how unlikely the engine found it."""
    if masked or logprob is None:
        return "masked"
    if logprob >= -0.1:
        return "sure"
    if logprob >= -1.0:
        return "mid"
    if logprob >= -3.0:
        return "low"
    return "vlow"


def token_display(text: str) -> str:
    """A token made visible: newlines as ↵ (then a real line break), tabs as →."""
    return text.replace("\n", "↵\n").replace("\t", "→")


def token_detail(turn: TurnDetail, index: int, logprobs: str | None = None) -> str:
    """One line on a sampled token: its text, id, logprob, probability and top alternatives;
    `logprobs` in the logprob's place (a replay's: both engines')."""
    texts = turn.token_texts or []
    ids = turn.sampled_ids or []
    lps = turn.logprobs or []
    tops = turn.top_logprobs or []
    mask = turn.mask or []
    text = texts[index] if index < len(texts) else "?"
    parts = [f"token {index}: {text!r}"]
    if index < len(ids):
        parts.append(f"id {ids[index]}")
    lp = lps[index] if index < len(lps) else None
    if logprobs is not None:
        parts.append(logprobs)
    elif lp is not None:
        parts.append(f"logprob {lp:.3f} (p={math.exp(lp):.3f})")
    else:
        parts.append("no logprob")
    if index < len(mask) and not mask[index]:
        parts.append("masked (not trained on)")
    alternatives = tops[index] if index < len(tops) else None
    if alternatives:
        alts = ", ".join(f"{token!r} {logprob:.2f}" for token, logprob in alternatives[:5])
        parts.append(f"top: {alts}")
    else:
        parts.append("no alternatives captured (Setup: Alternatives)")
    return " · ".join(parts)


def message_text(message: Mapping[str, Any]) -> str:
    """`role: content` of one chat message (content parts and tool calls flattened)."""
    content = message.get("content")
    if isinstance(content, list):
        content = " ".join(str(p.get("text", p)) if isinstance(p, Mapping) else str(p) for p in content)
    text = f"{message.get('role', '?')}: {content or ''}"
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {}) if isinstance(call, Mapping) else {}
        text += f"\n  → {fn.get('name', '?')}({fn.get('arguments', '')})"
    return text
