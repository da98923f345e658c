"""The sessions of one server: opening (probe, key), closing, lookup by id and key, summaries.

Every session's graph lives here; it is only touched on threads holding the session's `rw` lock
(commits on the store's own executor, admin reads in the default pool), so the loop never waits
on a reader. Summaries use the stats cached at each commit. A closed session releases its live
state (and its activity entry, to the activity log's bounded closed set) once no call is in
flight; a restarted server's sessions are listed, never callable.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any, Literal

import httpx

from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.capture.interning import Interner
from tapdeck.proxy.capture.policy_stamp import SpanTally
from tapdeck.proxy.capture.tokens import PromptIdsMemo
from tapdeck.proxy.capture.validation import reported_stats
from tapdeck.proxy.dialects.arguments import ArgumentsMemo
from tapdeck.proxy.dialects.stored_responses import StoredResponses
from tapdeck.proxy.http.events import EventBus
from tapdeck.proxy.sessions.activity import ActivityLog
from tapdeck.proxy.sessions.kept_graphs import KeptGraphs
from tapdeck.proxy.sessions.keys import is_session_key, new_session_id, new_session_key
from tapdeck.proxy.sessions.live import LiveSession, stored_span, stored_stats
from tapdeck.proxy.sessions.spec import SessionError, SessionSpec, base_urls_for
from tapdeck.proxy.store.database import Store
from tapdeck.proxy.store.writes import StoreUnavailable, StoreWrites
from tapdeck.proxy.upstream.address import settle
from tapdeck.proxy.upstream.client import EngineClient
from tapdeck.proxy.upstream.default_engine import DefaultEngine
from tapdeck.proxy.upstream.policy_versions import PolicyVersions
from tapdeck.proxy.upstream.tiers import EngineSpec, ProbeResult, probe
from tapdeck.proxy.upstream.token_in import TokenIn
from tapdeck.schema.events import SessionClosed, SessionOpened, SessionUpdated
from tapdeck.schema.findings import Finding
from tapdeck.schema.sessions import EngineRef, RolloutStats, SessionInfo, SessionSummary, Tier

log = logging.getLogger("tapdeck.proxy")


class SessionRegistry:
    """Owns the sessions of one server, their engine clients and their store writes."""

    def __init__(
        self,
        store: Store,
        events: EventBus,
        activity: ActivityLog,
        *,
        default_engine: DefaultEngine,
        public_url: str,
        engine_timeout: httpx.Timeout | float,
        max_reply_bytes: int,
    ) -> None:
        self.store = store
        self.events = events
        self.activity = activity
        self.default_engine = default_engine
        self.public_url = public_url
        self.engine_timeout = engine_timeout
        self.max_reply_bytes = max_reply_bytes
        self.writes = StoreWrites()
        """Every store write runs here, never in the default pool the admin reads share."""
        self.sessions: dict[str, LiveSession] = {}
        self.by_key: dict[str, LiveSession] = {}
        self.clients: dict[tuple[str, str | None, str], EngineClient] = {}
        self.versions = PolicyVersions()
        """The engines' policy versions: posted by trainers, reported by engines."""
        self._settled: dict[tuple[str, str | None, str], str] = {}
        """Engine address (as a session named it) → the base URL it settled on."""
        self.kept = KeptGraphs()
        """Graphs of sessions no longer live, for the reads that follow (opening a rollout)."""
        self._load_existing()

    def _load_existing(self) -> None:
        """Sessions from an earlier server on this store: listed, exportable, never callable.

        One left `open` lost its server mid-rollout, so it is marked `interrupted`.
        """
        for record in self.store.list_sessions():
            state = record.get("state", "closed")
            if state == "open":
                state = "interrupted"
                self.store.update_session(record["id"], state=state)
            record = {**record, "state": state}
            engine = record.get("engine") or {}
            counts = record.get("finding_counts") or {}
            self.sessions[record["id"]] = LiveSession(
                id=record["id"],
                record=record,
                tier=Tier(record.get("tier", Tier.TEXT)),
                engine=None,
                client=None,
                served_model=engine.get("model"),
                state=state,
                turns=int(record.get("stored_turns") or 0),
                findings=[Finding.model_validate(f) for f in record.get("findings") or []],
                stats=stored_stats(record.get("stats")),
                fatal=int(counts.get("fatal") or 0),
                warn=int(counts.get("warn") or 0),
            )

    async def aclose(self) -> None:
        """Close the pooled engine connections; let the store writes already submitted finish."""
        await asyncio.to_thread(self.writes.shutdown)
        for client in self.clients.values():
            await client.aclose()
        self.clients.clear()

    def _client_for(self, spec: EngineSpec) -> EngineClient:
        key = spec.cache_key()
        client = self.clients.get(key)
        if client is None:
            client = self.clients[key] = EngineClient(
                spec, timeout=self.engine_timeout, max_reply_bytes=self.max_reply_bytes
            )
        return client

    async def _settle(self, spec: EngineSpec) -> EngineSpec:
        """`spec` at the base URL its address settled on (asked once per address and key).

        An address where nothing answers is refused, naming the URLs tried, rather than opening a
        text-tier session whose every call would fail."""
        if spec == self.default_engine.spec:
            return spec  # settled when the server's engine answered
        key = spec.cache_key()
        base = self._settled.get(key)
        if base is None:
            base = self._settled[key] = (await settle(spec.url, api_key=spec.api_key)).base_url
        return spec if base == spec.base_url else spec.model_copy(update={"url": base})

    async def open(self, spec: SessionSpec) -> SessionInfo:
        """Probe the session's engine (cached), pick the rollout type, mint the key."""
        # While the server still waits for its engine, a 503 with Retry-After (EngineLoading).
        engine = await self._settle(spec.engine) if spec.engine else self.default_engine.get()
        if engine is None:
            raise SessionError(
                400,
                "no engine given and this server has no default engine; "
                "name one in the session's `engine` field",
            )
        client = self._client_for(engine)
        result: ProbeResult = await probe(engine, client, allow_raw_logprobs=spec.allow_raw_logprobs)
        if spec.rollout_type == "train" and result.tier is not Tier.TOKENS:
            raise SessionError(
                400,
                f"training needs an engine at the tokens tier; {engine.base_url} "
                f"is at the {result.tier} tier ({result.detail})",
            )
        rollout_type: Literal["train", "eval"] = (
            "train"
            if (spec.rollout_type == "train" or (spec.rollout_type == "auto" and result.tier is Tier.TOKENS))
            else "eval"
        )
        now = time.time()
        sid, key = new_session_id(), new_session_key()
        ref = EngineRef(
            url=engine.base_url,
            model=result.served_model or engine.model,
            max_model_len=result.max_model_len,
            system_fingerprint=result.system_fingerprint,
        )
        record: dict[str, Any] = {
            "id": sid,
            "state": "open",
            "tier": str(result.tier),
            "rollout_type": rollout_type,
            "engine": ref.model_dump(),
            "created_at": now,
            "metadata": dict(spec.metadata),
            "call_budget": spec.call_budget,
            "max_output_tokens": spec.max_output_tokens,
            "min_loss_mask_fraction": spec.min_loss_mask_fraction,
            "probe": result.detail,
            "alternatives": min(spec.alternatives, result.alternatives),
            "token_in": result.tier is Tier.TOKENS
            and (spec.token_in if spec.token_in is not None else rollout_type == "train"),
            "findings": [f.model_dump(mode="json") for f in result.findings],
        }
        try:
            await self.writes.run(self.store.create_session, record)
        except StoreUnavailable as exc:
            raise SessionError(
                503, f"the capture store cannot record a new session ({exc.reason}); retry later"
            ) from exc
        graph = RolloutGraph()
        session = LiveSession(
            id=sid,
            record=record,
            tier=result.tier,
            engine=engine,
            client=client,
            served_model=ref.model,
            state="open",
            call_budget=spec.call_budget,
            output_limit=spec.max_output_tokens,
            training=rollout_type == "train",
            training_sampling=spec.training_sampling,
            graph=graph,
            findings=list(result.findings),
            stats=graph.stats(),
            token_in=TokenIn(
                client, tool_parser=engine.tool_call_parser, reasoning_parser=engine.reasoning_parser
            )
            if record["token_in"]
            else None,
        )
        session.count(session.findings)
        self.sessions[sid] = session
        self.by_key[key] = session
        self.events.publish(SessionOpened(session=self.summary(session)).model_dump(mode="json"))
        return SessionInfo(
            id=sid,
            api_key=key,
            tier=result.tier,
            rollout_type=rollout_type,
            base_urls=base_urls_for(self.public_url),
            engine=ref,
            created_at=now,
            metadata=record["metadata"],
        )

    async def close(self, session_id: str) -> SessionSummary:
        """Stop accepting calls on the session and release its live state; its data stays.

        A close the store cannot record still stops the session here (a restart then lists it as
        `interrupted`, which is what the disk says)."""
        session = self.lookup(session_id)
        if session.state == "open":
            session.state = "closed"
            session.record["state"] = "closed"
            for key, s in list(self.by_key.items()):
                if s is session:
                    del self.by_key[key]
            self.release_if_idle(session)
            stats = session.stats
            try:  # stats and finding counts kept so that a restart lists it without its graph
                await self.writes.run(
                    self.store.update_session,
                    session_id,
                    state="closed",
                    stats=None if stats is None else stats.model_dump(),
                    policy=None if (span := session.policy.span()) is None else span.model_dump(),
                    finding_counts={"fatal": session.fatal, "warn": session.warn},
                )
            except StoreUnavailable as exc:
                log.warning(
                    "session %s: closed, but the store could not record it (%s)", session_id, exc.reason
                )
        # A restarted session's stats may need its graph loaded: done on a thread.
        summary = await asyncio.to_thread(self.summary, session)
        self.events.publish(SessionClosed(session=summary).model_dump(mode="json"))
        return summary

    def release_if_idle(self, session: LiveSession) -> None:
        """Drop a closed session's live state once no call is in flight: its graph is rebuilt
        from the store when asked for, and nothing else of it is needed again."""
        if session.state == "open" or session.in_flight:
            return
        if session.graph is not None:  # whole: the reads that follow a close need not rebuild it
            self.kept.keep(session.id, session.graph)
        session.graph = None
        session.interner = Interner()
        session.arguments = ArgumentsMemo()
        session.stored_responses = StoredResponses()
        session.prompt_ids = PromptIdsMemo()
        self.store.forget(session.id)
        self.activity.closed(session.id)

    def annotate(self, session_id: str, **metadata: Any) -> SessionSummary:
        """Merge `metadata` into the session's (phase, reward, run_id, ...) and publish it.

        The write goes to the store's executor and is not waited for (an fsync must not hold the
        loop); each write stores the metadata as it is when it runs, so the last one wins."""
        session = self.lookup(session_id)
        session.record["metadata"] = {**session.record.get("metadata", {}), **metadata}
        self.writes.submit(self._store_field, session, "metadata")
        summary = self.summary(session)
        self.events.publish(SessionUpdated(session=summary).model_dump(mode="json"))
        return summary

    def limit_output(self, session_id: str, tokens: int) -> None:
        """Enforce `tokens` output tokens per call from the session's next call on (stored with it)."""
        if tokens < 1:
            raise ValueError(f"an output limit must be at least 1 token, not {tokens}")
        session = self.lookup(session_id)
        session.output_limit = session.record["max_output_tokens"] = tokens
        self.writes.submit(self._store_field, session, "max_output_tokens")

    def mark_auxiliary(self, session_id: str, seqs: Iterable[int], reason: str) -> None:
        """Demote captured calls to auxiliary after the fact (masked out of training, shown as
        auxiliary): e.g. calls the harness's own trajectory never recorded. Kept in the session's
        metadata (`auxiliary_seqs`), so a restarted server demotes them again: stored before this
        returns (call it on a thread)."""
        session = self.lookup(session_id)
        with session.rw:
            graph = self.graph(session)
            demoted = sorted(
                {
                    *session.record.get("metadata", {}).get("auxiliary_seqs", []),
                    *(s for s in seqs if s in graph.nodes),
                }
            )
            graph.demote(demoted, reason)
            session.stats = graph.stats()
        session.record["metadata"] = {
            **session.record.get("metadata", {}),
            "auxiliary_seqs": demoted,
            "auxiliary_reason": reason,
        }
        self.writes.submit_and_wait(self._store_field, session, "metadata")
        self.publish_update(session)

    def _store_field(self, session: LiveSession, field: str) -> None:
        # Reads the field when the write runs, so of queued writes the last one wins. A store
        # fault is logged, never raised: the value holds in memory, only its record is lost.
        try:
            self.store.update_session(session.id, **{field: session.record[field]})
        except Exception as exc:  # noqa: BLE001 - any store fault: logged, the value kept in memory
            log.warning("session %s: %s not stored (%s)", session.id, field, exc)

    async def add_finding(self, session: LiveSession, finding: Finding) -> None:
        """A session-level finding, stored and published (kept only once stored)."""
        findings = [*session.findings, finding]
        dumped = [f.model_dump(mode="json") for f in findings]
        try:
            await self.writes.run(self.store.update_session, session.id, findings=dumped)
        except StoreUnavailable as exc:
            log.error("session %s: finding not stored (%s): %s", session.id, exc.reason, finding)
            return
        session.findings.append(finding)
        session.count([finding])
        session.record["findings"] = dumped
        log.warning("session %s: %s", session.id, finding)
        self.publish_update(session)

    def publish_update(self, session: LiveSession) -> None:
        """Publish the session's summary (built only when someone listens)."""
        self.events.publish(lambda: SessionUpdated(session=self.summary(session)).model_dump(mode="json"))

    def lookup(self, session_id: str) -> LiveSession:
        """The session with this id, else a 404 SessionError."""
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionError(404, f"no session {session_id}")
        return session

    def for_key(self, key: str | None) -> LiveSession | None:
        """The open session a key names (charset-checked before any lookup)."""
        if not key or not is_session_key(key):
            return None
        return self.by_key.get(key)

    def record(self, session: LiveSession) -> dict[str, Any]:
        """The session's stored record with its live state, turn count and last call time."""
        return {
            **session.record,
            "state": session.state,
            "turns": session.turns,
            "last_call_at": session.last_call_at,
        }

    def graph(self, session: LiveSession) -> RolloutGraph:
        """The session's graph. One that is not live (a restarted or closed session's) is
        rebuilt from the store, and the last few are kept. Call on a thread, holding `rw`."""
        if session.graph is not None:
            return session.graph
        if session.state != "open" and (kept := self.kept.get(session.id)) is not None:
            return kept
        _record, graph = self.store.load_graph(session.id)
        session.fatal = session.warn = 0
        session.count([*session.findings, *graph.findings()])
        # The store demoted the calls its record names; this record may name more if storing
        # its metadata failed (logged, kept in memory).
        metadata = session.record.get("metadata") or {}
        graph.demote(metadata.get("auxiliary_seqs") or [], metadata.get("auxiliary_reason", ""))
        session.turns = len(graph)
        session.stats = graph.stats()
        session.policy = SpanTally()
        for seq in sorted(graph.nodes):
            session.policy.add(graph.nodes[seq].turn.policy)
        session.last_call_at = max((n.turn.created_at for n in graph.nodes.values()), default=None)
        if session.state == "open":
            session.graph = graph  # a live session's graph whose state a store fault dropped
        else:
            self.kept.keep(session.id, graph)
        return graph

    def _stats(self, session: LiveSession) -> RolloutStats:
        """The cached stats; a restarted session's are computed once (on a thread)."""
        if session.stats is None:
            with session.rw:
                self.graph(session)
        assert session.stats is not None
        return session.stats

    def summary(self, session: LiveSession) -> SessionSummary:
        """The session as the Sessions board shows it."""
        now = time.time()
        # Turns counted on capture (the stats are those of the last linked turn).
        rollout_type = session.record.get("rollout_type", "eval")
        stats = {**reported_stats(self._stats(session), session.tier, rollout_type), "turns": session.turns}
        calling = session.calling_since()
        return SessionSummary(
            **stats,
            id=session.id,
            state=session.state,
            tier=session.tier,
            rollout_type=rollout_type,
            created_at=session.record.get("created_at", 0.0),
            last_call_at=session.last_call_at,
            seconds_since_last_call=None if session.last_call_at is None else now - session.last_call_at,
            calling_since=calling,
            seconds_calling=None if calling is None else max(0.0, now - calling),
            metadata=session.record.get("metadata") or {},
            fatal=session.fatal,
            warn=session.warn,
            engine=EngineRef(**(session.record.get("engine") or {"url": ""})),
            policy=session.policy.span() or stored_span(session.record.get("policy")),
            calls_awaiting_engine=session.awaiting_engine,
        )


__all__ = ["SessionRegistry"]
