"""The read side of the admin API: session lists, findings, the graph, exports, one turn.

Each read runs on a worker thread and holds its session's graph lock only while it reads; a
restarted or closed session's graph is rebuilt from the store, and the last few are kept
(proxy/sessions/kept_graphs.py).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any, TypeVar

from tapdeck.proxy.capture.export import graph_view, turn_detail
from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.capture.validation import validate_rollout
from tapdeck.proxy.sessions.registry import SessionRegistry
from tapdeck.proxy.sessions.spec import SessionError
from tapdeck.schema.findings import Finding
from tapdeck.schema.sessions import SessionSummary, Tier

T = TypeVar("T")
Build = Callable[[dict[str, Any], RolloutGraph, Tier], T]
"""An export of one session: (record, graph, tier) → its document."""


class SessionQueries:
    """Answers the admin API's reads from the registry's sessions."""

    def __init__(self, registry: SessionRegistry) -> None:
        self.registry = registry

    def get(self, session_id: str) -> SessionSummary:
        """One session's summary."""
        return self.registry.summary(self.registry.lookup(session_id))

    def list(self) -> list[SessionSummary]:
        """Every session this server knows, newest first."""
        return sorted(
            (self.registry.summary(s) for s in self.registry.sessions.values()),
            key=lambda s: s.created_at,
            reverse=True,
        )

    # `list` in this class body is the method above: the builtin is named in full.
    def findings(self, session_id: str) -> builtins.list[Finding]:
        """Session, turn and rollout findings."""
        session = self.registry.lookup(session_id)
        with session.rw:
            graph = self.registry.graph(session)
            out = list(session.findings)
            out.extend(graph.findings())
            out.extend(
                validate_rollout(
                    graph,
                    session.tier,
                    rollout_type=session.record.get("rollout_type", "auto"),
                    min_loss_mask_fraction=session.record.get("min_loss_mask_fraction"),
                )
            )
        return out

    def export(self, session_id: str, build: Build[T]) -> T:
        """`build` over the session's record, graph and tier, under its graph lock. An export the
        rollout cannot give (a training trace of an eval rollout) raises ExportRefused (409)."""
        session = self.registry.lookup(session_id)
        with session.rw:
            return build(self.registry.record(session), self.registry.graph(session), session.tier)

    def graph_view(self, session_id: str, since: int = 0) -> dict[str, Any]:
        """The graph without tokens: headers of turns from `since` on, links, stats, findings."""
        session = self.registry.lookup(session_id)
        return self.export(
            session_id,
            lambda record, graph, tier: graph_view(
                record, graph, tier, since=since, findings=session.findings
            ),
        )

    def turn_detail(self, session_id: str, seq: int) -> dict[str, Any]:
        """Everything the TUI shows for one turn."""
        session = self.registry.lookup(session_id)
        with session.rw:
            graph = self.registry.graph(session)
            if seq not in graph.nodes:
                raise SessionError(404, f"session {session_id} has no turn {seq}")
            return turn_detail(graph, seq)


__all__ = ["SessionQueries"]
