"""A capture session's live state in the server, and the budget slot each of its calls holds."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.capture.interning import Interner
from tapdeck.proxy.capture.policy_stamp import SpanTally
from tapdeck.proxy.capture.tokens import PromptIdsMemo
from tapdeck.proxy.dialects.arguments import ArgumentsMemo
from tapdeck.proxy.dialects.stored_responses import StoredResponses
from tapdeck.proxy.upstream.client import EngineClient
from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.proxy.upstream.token_in import TokenIn
from tapdeck.schema.findings import Finding, Level
from tapdeck.schema.sessions import PolicySpan, RolloutStats, SessionState, Tier


@dataclass
class LiveSession:
    """A session's live state. Cold (restarted) sessions get a graph only when first asked."""

    id: str
    record: dict[str, Any]
    tier: Tier
    engine: EngineSpec | None
    client: EngineClient | None
    served_model: str | None
    state: SessionState
    call_budget: int | None = None
    output_limit: int | None = None
    """Output tokens per call, enforced on the wire whatever the harness asks (None: the engine's cap)."""
    training: bool = False
    training_sampling: dict[str, Any] | None = None
    graph: RolloutGraph | None = None
    turns: int = 0
    in_flight: int = 0
    call_starts: list[float] = field(default_factory=list)
    """When each call now in flight reached the proxy (wall clock), oldest first: the board's
    "calling" age and its stuck-first order."""
    awaiting_engine: int = 0
    """Calls waiting out an engine's 503 (proxy/upstream/update_wait.py) right now."""
    last_call_at: float | None = None
    fatal: int = 0
    warn: int = 0
    findings: list[Finding] = field(default_factory=list)
    """Session-level findings (probe results, context-full stops); turn findings live on turns."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Orders a session's commits (one append at a time, in seq order)."""
    rw: threading.RLock = field(default_factory=threading.RLock)
    """Guards the graph: admin reads run in worker threads while the loop links new turns."""
    stored_responses: StoredResponses = field(default_factory=StoredResponses)
    """Responses API replies, for calls that name a `previous_response_id`."""
    fold_system: bool = False
    """The engine's chat template refused a system message after the first turn: fold them all
    into the leading one from then on."""
    token_in: TokenIn | None = None
    """Set when the session continues held conversations from their ids (token-in mode)."""
    interner: Interner = field(default_factory=Interner)
    """Every turn's request refers to the session's shared message and tool objects, so a
    conversation resent on each call is held once, not once per turn."""
    arguments: ArgumentsMemo = field(default_factory=ArgumentsMemo)
    """Sampled tool-call argument strings of this session only: a sibling rollout's sampling
    must never re-render this one's history."""
    prompt_ids: PromptIdsMemo = field(default_factory=PromptIdsMemo)
    """The last prompt ids the engine replied with: the next reply's are parsed past them only."""
    stats: RolloutStats | None = None
    """The graph's stats as of the last commit (what summaries show; None until known)."""
    policy: SpanTally = field(default_factory=SpanTally)
    """The policy versions its turns were sampled with, as they were committed."""

    def count(self, findings: list[Finding]) -> None:
        """Add these findings to the session's FATAL and WARN counts."""
        for f in findings:
            if f.level is Level.FATAL:
                self.fatal += 1
            elif f.level is Level.WARN:
                self.warn += 1

    def calling_since(self) -> float | None:
        """When the oldest call now in flight reached the proxy; None while none is."""
        return min(self.call_starts) if self.call_starts else None

    def budget_reached(self) -> bool:
        """Whether captured plus in-flight calls have used up the session's call budget."""
        return self.call_budget is not None and self.turns + self.in_flight >= self.call_budget


class CallSlot:
    """One call's place in its session's in-flight count, given back exactly once."""

    __slots__ = ("held", "recording", "session", "started_at")

    def __init__(self, session: LiveSession) -> None:
        self.session = session
        self.held = True
        self.recording: asyncio.Future[None] | None = None
        """The turn's record once the engine answered (it goes on if the caller leaves)."""
        self.started_at = time.time()
        session.in_flight += 1
        session.call_starts.append(self.started_at)

    def release(self) -> None:
        """Give the place back (a second release does nothing)."""
        if self.held:
            self.held = False
            self.session.in_flight -= 1
            self.session.call_starts.remove(self.started_at)


def stored_stats(value: Any) -> RolloutStats | None:
    """Stats a clean close stored with the session (None when absent or of another shape: they
    are then computed from the turns once)."""
    if not isinstance(value, dict):
        return None
    try:
        return RolloutStats.model_validate(value)
    except ValidationError:
        return None


def stored_span(value: Any) -> PolicySpan | None:
    """The policy span a clean close stored with the session (None when absent or unreadable:
    then known once the session's turns are loaded)."""
    if not isinstance(value, dict):
        return None
    try:
        return PolicySpan.model_validate(value)
    except ValidationError:
        return None
