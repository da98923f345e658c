"""The capture service: one server's sessions, model calls and admin reads behind one object.

A thin facade the routes and the runner hold; the work is done by
- `SessionRegistry` (proxy/sessions/registry.py): opening, closing, lookup, summaries;
- `CallPipeline` (proxy/http/call_pipeline.py): one harness request, from path and key to the reply
  in its dialect, with `CallCapture` (proxy/capture/call.py) calling the engine and recording the
  turn before the reply leaves;
- `SessionQueries` (proxy/sessions/queries.py): lists, findings, the graph, exports, one turn.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import Any

import httpx

from tapdeck.proxy.capture.call import CallCapture
from tapdeck.proxy.capture.export import rollout_document, training_trace
from tapdeck.proxy.config import DEFAULT_ENGINE_UPDATE_WAIT_S, DEFAULT_MAX_REPLY_BYTES
from tapdeck.proxy.http.call_pipeline import CallPipeline
from tapdeck.proxy.http.call_reply import CallReply
from tapdeck.proxy.http.events import EventBus
from tapdeck.proxy.http.sse import KEEPALIVE_SECONDS
from tapdeck.proxy.sessions.activity import ActivityLog
from tapdeck.proxy.sessions.queries import SessionQueries
from tapdeck.proxy.sessions.registry import SessionRegistry
from tapdeck.proxy.sessions.spec import SessionSpec
from tapdeck.proxy.store.database import Store
from tapdeck.proxy.upstream.client import DEFAULT_TIMEOUT
from tapdeck.proxy.upstream.default_engine import DefaultEngine
from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.schema.findings import Finding
from tapdeck.schema.sessions import SessionInfo, SessionSummary


class CaptureService:
    """Owns the sessions of one server and everything a model call goes through."""

    def __init__(
        self,
        store: Store,
        *,
        default_engine: DefaultEngine | EngineSpec | None,
        public_url: str,
        keepalive_s: float = KEEPALIVE_SECONDS,
        engine_timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
        engine_update_wait_s: float = DEFAULT_ENGINE_UPDATE_WAIT_S,
    ) -> None:
        self.store = store
        self.default_engine = DefaultEngine.of(default_engine)
        """The server's default engine, or why not yet; the registry and the runner hold this one."""
        self.public_url = public_url.rstrip("/")
        self.events = EventBus()
        self.activity = ActivityLog()
        """Calls in flight and each session's last exchange (the stuck-rollout view)."""
        self.registry = SessionRegistry(
            store,
            self.events,
            self.activity,
            default_engine=self.default_engine,
            public_url=self.public_url,
            engine_timeout=engine_timeout,
            max_reply_bytes=max_reply_bytes,
        )
        self.writes = self.registry.writes
        self.queries = SessionQueries(self.registry)
        self.calls = CallPipeline(
            self.registry,
            CallCapture(self.registry, self.activity, engine_update_wait_s=engine_update_wait_s),
            keepalive_s=keepalive_s,
        )
        # The live maps, as tests and benches inspect them.
        self._sessions = self.registry.sessions
        self._clients = self.registry.clients
        self._graph = self.registry.graph

    @property
    def engine_timeout(self) -> httpx.Timeout | float:
        """The timeout of engine clients made from now on."""
        return self.registry.engine_timeout

    @engine_timeout.setter
    def engine_timeout(self, value: httpx.Timeout | float) -> None:
        self.registry.engine_timeout = value

    @property
    def keepalive_s(self) -> float:
        """Seconds between keepalives on a stream whose engine call is still running."""
        return self.calls.keepalive_s

    @keepalive_s.setter
    def keepalive_s(self, value: float) -> None:
        self.calls.keepalive_s = value

    async def aclose(self) -> None:
        """Close the pooled engine connections; let the store writes already submitted finish."""
        await self.registry.aclose()
        await self.calls.aclose()

    # ----------------------------------------------------------------- sessions

    async def open_session(self, spec: SessionSpec) -> SessionInfo:
        """Probe the session's engine (cached), pick the rollout type, mint the key."""
        return await self.registry.open(spec)

    async def close_session(self, session_id: str) -> SessionSummary:
        """Stop accepting calls on the session and release its live state; its data stays."""
        return await self.registry.close(session_id)

    def annotate(self, session_id: str, **metadata: Any) -> SessionSummary:
        """Merge `metadata` into the session's (phase, reward, run_id, ...) and publish it."""
        return self.registry.annotate(session_id, **metadata)

    def limit_output(self, session_id: str, tokens: int) -> None:
        """Enforce `tokens` output tokens per call on the session from its next call on."""
        self.registry.limit_output(session_id, tokens)

    def mark_auxiliary(self, session_id: str, seqs: Iterable[int], reason: str) -> None:
        """Demote captured calls to auxiliary after the fact (call it on a thread)."""
        self.registry.mark_auxiliary(session_id, seqs, reason)

    # ----------------------------------------------------------------- reads

    def get(self, session_id: str) -> SessionSummary:
        """One session's summary."""
        return self.queries.get(session_id)

    def list(self) -> list[SessionSummary]:
        """Every session this server knows, newest first."""
        return self.queries.list()

    # `list` in this class body is the method above: the builtin is named in full.
    def findings(self, session_id: str) -> builtins.list[Finding]:
        """Session, turn and rollout findings."""
        return self.queries.findings(session_id)

    def rollout_document(self, session_id: str, *, lists: bool = True) -> dict[str, Any]:
        """The rollout document (turns, stats, sequences, findings, tier). `lists=False` keeps
        token arrays as numpy (for orjson's numpy serialisation: far faster on long rollouts)."""
        return self.queries.export(session_id, partial(rollout_document, lists=lists))

    def graph_view(self, session_id: str, since: int = 0) -> dict[str, Any]:
        """The graph without tokens: headers of turns from `since` on, links, stats, findings."""
        return self.queries.graph_view(session_id, since)

    def training_trace(self, session_id: str, *, lists: bool = True) -> dict[str, Any]:
        """The per-call training trace; refused (409) for an eval rollout. `lists` as above. The
        session's latest replay, if any, adds its reference logprobs to each entry's metadata."""
        reference = self.store.latest_reference(session_id)
        return self.queries.export(session_id, partial(training_trace, lists=lists, reference=reference))

    def turn_detail(self, session_id: str, seq: int) -> dict[str, Any]:
        """Everything the TUI shows for one turn."""
        return self.queries.turn_detail(session_id, seq)

    # ----------------------------------------------------------------- model calls

    def models(
        self, path: str, headers: Mapping[str, str], query: Mapping[str, str], model_id: str | None = None
    ) -> CallReply:
        """A models route (`GET /v1/models[/{id}]`, `/v1beta/models[/{model}]`) with a session
        key: the session's model only, in the asking SDK's shape."""
        return self.calls.models(path, headers, query, model_id)

    async def handle_call(
        self,
        path: str,
        query: Mapping[str, str],
        headers: Mapping[str, str],
        body: bytes | Callable[[], Awaitable[bytes]],
        until_disconnect: Callable[[], Awaitable[None]] | None = None,
    ) -> CallReply:
        """Answer one harness request in its own dialect (proxy/http/call_pipeline.py)."""
        return await self.calls.handle_call(path, query, headers, body, until_disconnect)


__all__ = ["CallReply", "CaptureService"]
