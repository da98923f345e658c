"""The capture service: sessions, the model-call flow, and the queries behind the admin API.

One model call: detect the dialect by path → check the session key → parse → budget check →
prepare the upstream body → call the engine → parse the capture → build a Turn → link it into the
session's rollout graph and commit it to the store (together, on a store thread: the graph, the
counters and the exports only ever hold what is on disk) → publish an event → render the reply in
the caller's dialect. A store that cannot commit (disk full, read-only, locked) answers 503.

The loop never waits on a lock a reader holds: the graph is only touched on threads (commits on
the store's own executor, admin reads in the default pool), and the summaries events carry come
from stats cached at each commit. A closed session releases its live state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx
import orjson
from pydantic import ValidationError

from tapdeck.proxy.access_log import CURRENT_CALL, AccessRecord
from tapdeck.proxy.activity import ActivityLog
from tapdeck.proxy.aux import aux_dialect, count_tokens, match_aux
from tapdeck.proxy.dialects import detect
from tapdeck.proxy.dialects.arguments import ArgumentsMemo, arguments_memo
from tapdeck.proxy.dialects.base import Dialect, DialectError, DialectRequest, SSEEvent
from tapdeck.proxy.dialects.chat import DIALECT as CHAT
from tapdeck.proxy.dialects.chat import fold_system_messages, has_late_system
from tapdeck.proxy.dialects.google import JSON_ARRAY
from tapdeck.proxy.dialects.responses import DIALECT as RESPONSES
from tapdeck.proxy.dialects.stored_responses import StoredResponses
from tapdeck.proxy.engine_address import EngineAddressError, settle
from tapdeck.proxy.engine_client import DEFAULT_TIMEOUT, EngineClient, EngineError
from tapdeck.proxy.events import EventBus
from tapdeck.proxy.export import (
    ExportRefused,
    capture_mode,
    graph_view,
    rollout_document,
    training_trace,
)
from tapdeck.proxy.findings import Finding, Level
from tapdeck.proxy.graph import Link, RolloutGraph
from tapdeck.proxy.interning import Interner
from tapdeck.proxy.json_mode import answer_as_json, json_format
from tapdeck.proxy.request_limits import (
    MALFORMED,
    MAX_JSON_DEPTH,
    BodyIncomplete,
    BodyTooLarge,
    malformed_message,
    too_deep,
)
from tapdeck.proxy.sessions import (
    EngineRef,
    SessionError,
    SessionInfo,
    SessionSpec,
    SessionSummary,
    base_urls_for,
    is_session_key,
    key_from_request,
    new_session_id,
    new_session_key,
)
from tapdeck.proxy.sse import KEEPALIVE, KEEPALIVE_SECONDS, json_array_with_keepalive, stream_with_keepalive
from tapdeck.proxy.store import Store
from tapdeck.proxy.store_writes import StoreUnavailable, StoreWrites
from tapdeck.proxy.tiers import EngineSpec, ProbeResult, Tier, probe
from tapdeck.proxy.token_in import Plan, TokenIn
from tapdeck.proxy.turn import Turn
from tapdeck.proxy.validation import validate_rollout, validate_turn
from tapdeck.schema.events import SessionClosed, SessionOpened, SessionUpdated, TurnCaptured
from tapdeck.schema.sessions import RolloutStats, TurnHeader

log = logging.getLogger("tapdeck.proxy")

BUDGET_STOP_TEXT = ("[tapdeck] This session's model-call budget ({budget} calls) is used up; "
                    "the conversation ends here.")
CONTEXT_STOP_TEXT = ("[tapdeck] The conversation no longer fits the model's context window; "
                     "the conversation ends here.")
TEMPLATE_REFUSAL = re.compile(r"system|role|alternate|template", re.IGNORECASE)
"""What an engine's 400 says when its chat template refuses a message's place (vLLM passes the
template's own words: "System message must be at the beginning.", "Conversation roles must
alternate user/assistant/...")."""
ENGINE_DOWN = ("unreachable", "timeout", "bad_reply", "upstream_5xx")
"""Engine failure kinds that mean the engine cannot serve (not a request it refused)."""
SESSION_HEADER = "x-session-id"
STORE_DOWN_TEXT = ("tapdeck could not record this call ({reason}); nothing of it was kept. "
                   "Retry once the capture store can write again.")
"""opencode's own session header: recorded in turn meta, never used for routing."""


@dataclass
class CallReply:
    """What the HTTP layer sends back: a JSON body, or an SSE byte stream."""

    status: int = 200
    body: Any = None
    stream: AsyncIterator[bytes] | None = None
    media_type: str = "text/event-stream"
    """The stream's content type (Google's non-SSE stream is a JSON array)."""
    kind: str | None = None
    """An error reply's kind (`authentication_error`, `unreachable`, ...), for the access log."""


class _CallFailed(Exception):
    """A call that ends in an error reply in the caller's dialect."""

    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


@dataclass
class _Session:
    """A session's live state. Cold (restarted) sessions get a graph only when first asked."""

    id: str
    record: dict[str, Any]
    tier: Tier
    engine: EngineSpec | None
    client: EngineClient | None
    served_model: str | None
    state: str
    call_budget: int | None = None
    training: bool = False
    training_sampling: dict[str, Any] | None = None
    graph: RolloutGraph | None = None
    turns: int = 0
    in_flight: int = 0
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
    stats: RolloutStats | None = None
    """The graph's stats as of the last commit (what summaries show; None until known)."""

    def count(self, findings: list[Finding]) -> None:
        for f in findings:
            if f.level is Level.FATAL:
                self.fatal += 1
            elif f.level is Level.WARN:
                self.warn += 1


class CaptureService:
    """Owns the sessions of one server and everything a model call goes through."""

    def __init__(self, store: Store, *, default_engine: EngineSpec | None, public_url: str,
                 keepalive_s: float = KEEPALIVE_SECONDS,
                 engine_timeout: httpx.Timeout | float = DEFAULT_TIMEOUT) -> None:
        self.store = store
        self.default_engine = default_engine
        self.public_url = public_url.rstrip("/")
        self.keepalive_s = keepalive_s
        self.engine_timeout = engine_timeout
        self.events = EventBus()
        self.activity = ActivityLog()
        """Calls in flight and each session's last exchange (the stuck-rollout view)."""
        self.writes = StoreWrites()
        """Every store write runs here, never in the default pool the admin reads share."""
        self._sessions: dict[str, _Session] = {}
        self._by_key: dict[str, _Session] = {}
        self._clients: dict[tuple[str, str | None, str], EngineClient] = {}
        self._settled: dict[tuple[str, str | None, str], str] = {}
        """Engine address (as a session named it) → the base URL it settled on."""
        self._aux_http: httpx.AsyncClient | None = None
        self._load_existing()

    # ----------------------------------------------------------------- lifecycle

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
            self._sessions[record["id"]] = _Session(
                id=record["id"], record=record, tier=Tier(record.get("tier", Tier.TEXT)),
                engine=None, client=None, served_model=engine.get("model"), state=state,
                turns=int(record.get("stored_turns") or 0),
                findings=[Finding.model_validate(f) for f in record.get("findings") or []],
                stats=_stored_stats(record.get("stats")))

    async def aclose(self) -> None:
        """Close the pooled engine connections; let the store writes already submitted finish."""
        await asyncio.to_thread(self.writes.shutdown)
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
        if self._aux_http is not None:
            await self._aux_http.aclose()
            self._aux_http = None

    def _client_for(self, spec: EngineSpec) -> EngineClient:
        key = spec.cache_key()
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = EngineClient(spec, timeout=self.engine_timeout)
        return client

    async def _settle(self, spec: EngineSpec) -> EngineSpec:
        """`spec` at the base URL its address settled on (asked once per address and key).

        An address where nothing answers is refused, naming the URLs tried, rather than opening a
        text-tier session whose every call would fail."""
        if spec == self.default_engine:
            return spec  # settled when the server started
        key = spec.cache_key()
        base = self._settled.get(key)
        if base is None:
            try:
                settled = await settle(spec.url, api_key=spec.api_key)
            except EngineAddressError as exc:
                raise SessionError(exc.status, str(exc)) from None
            base = self._settled[key] = settled.base_url
        return spec if base == spec.base_url else spec.model_copy(update={"url": base})

    # ----------------------------------------------------------------- sessions

    async def open_session(self, spec: SessionSpec) -> SessionInfo:
        """Probe the session's engine (cached), pick the rollout type, mint the key."""
        engine = await self._settle(spec.engine) if spec.engine else self.default_engine
        if engine is None:
            raise SessionError(400, "no engine given and this server has no default engine; "
                                    "name one in the session's `engine` field")
        client = self._client_for(engine)
        result: ProbeResult = await probe(engine, client, allow_raw_logprobs=spec.allow_raw_logprobs)
        if spec.rollout_type == "train" and result.tier is not Tier.TOKENS:
            raise SessionError(400, f"training needs an engine at the tokens tier; {engine.base_url} "
                                    f"is at the {result.tier} tier ({result.detail})")
        rollout_type = "train" if (spec.rollout_type == "train" or (
            spec.rollout_type == "auto" and result.tier is Tier.TOKENS)) else "eval"
        now = time.time()
        sid, key = new_session_id(), new_session_key()
        ref = EngineRef(url=engine.base_url, model=result.served_model or engine.model,
                        max_model_len=result.max_model_len)
        record = {
            "id": sid, "state": "open", "tier": str(result.tier), "rollout_type": rollout_type,
            "engine": ref.model_dump(), "created_at": now, "metadata": dict(spec.metadata),
            "call_budget": spec.call_budget, "probe": result.detail,
            "alternatives": min(spec.alternatives, result.alternatives),
            "token_in": result.tier is Tier.TOKENS and (
                spec.token_in if spec.token_in is not None else rollout_type == "train"),
            "findings": [f.model_dump(mode="json") for f in result.findings],
        }
        try:
            await self.writes.run(self.store.create_session, record)
        except StoreUnavailable as exc:
            raise SessionError(503, f"the capture store cannot record a new session "
                                    f"({exc.reason}); retry later") from exc
        graph = RolloutGraph()
        session = _Session(id=sid, record=record, tier=result.tier, engine=engine, client=client,
                           served_model=ref.model, state="open", call_budget=spec.call_budget,
                           training=rollout_type == "train",
                           training_sampling=spec.training_sampling, graph=graph,
                           findings=list(result.findings), stats=graph.stats(),
                           token_in=TokenIn(client, tool_parser=engine.tool_call_parser,
                                            reasoning_parser=engine.reasoning_parser)
                           if record["token_in"] else None)
        session.count(session.findings)
        self._sessions[sid] = session
        self._by_key[key] = session
        self.events.publish(SessionOpened(session=self._summary(session)).model_dump(mode="json"))
        return SessionInfo(
            id=sid, api_key=key, tier=result.tier, rollout_type=rollout_type,
            base_urls=base_urls_for(self.public_url),
            engine=ref, created_at=now, metadata=record["metadata"])

    async def close_session(self, session_id: str) -> SessionSummary:
        """Stop accepting calls on the session and release its live state; its data stays.

        A close the store cannot record still stops the session here (a restart then lists it as
        `interrupted`, which is what the disk says)."""
        session = self._get(session_id)
        if session.state == "open":
            session.state = "closed"
            session.record["state"] = "closed"
            for key, s in list(self._by_key.items()):
                if s is session:
                    del self._by_key[key]
            self._release_if_idle(session)
            stats = session.stats
            try:
                await self.writes.run(self.store.update_session, session_id, state="closed",
                                      stats=None if stats is None else stats.model_dump())
            except StoreUnavailable as exc:
                log.warning("session %s: closed, but the store could not record it (%s)",
                            session_id, exc.reason)
        # A restarted session's stats may need its graph loaded: done on a thread.
        summary = await asyncio.to_thread(self._summary, session)
        self.events.publish(SessionClosed(session=summary).model_dump(mode="json"))
        return summary

    def _release_if_idle(self, session: _Session) -> None:
        """Drop a closed session's live state once no call is in flight: its graph is rebuilt
        from the store when asked for, and nothing else of it is needed again."""
        if session.state == "open" or session.in_flight:
            return
        session.graph = None
        session.interner = Interner()
        session.arguments = ArgumentsMemo()
        session.stored_responses = StoredResponses()
        self.store.forget(session.id)

    def get(self, session_id: str) -> SessionSummary:
        """One session's summary."""
        return self._summary(self._get(session_id))

    def list(self) -> list[SessionSummary]:
        """Every session this server knows, newest first."""
        return sorted((self._summary(s) for s in self._sessions.values()),
                      key=lambda s: s.created_at, reverse=True)

    def annotate(self, session_id: str, **metadata: Any) -> SessionSummary:
        """Merge `metadata` into the session's (phase, reward, run_id, ...) and publish it.

        The write goes to the store's executor and is not waited for (an fsync must not hold the
        loop); each write stores the metadata as it is when it runs, so the last one wins."""
        session = self._get(session_id)
        session.record["metadata"] = {**session.record.get("metadata", {}), **metadata}
        self.writes.submit(self._store_metadata, session)
        summary = self._summary(session)
        self.events.publish(SessionUpdated(session=summary).model_dump(mode="json"))
        return summary

    def mark_auxiliary(self, session_id: str, seqs: Iterable[int], reason: str) -> None:
        """Demote captured calls to auxiliary after the fact (masked out of training, shown as
        auxiliary): e.g. calls the harness's own trajectory never recorded. Kept in the session's
        metadata (`auxiliary_seqs`), so a restarted server demotes them again: stored before this
        returns (call it on a thread)."""
        session = self._get(session_id)
        with session.rw:
            graph = self._graph(session)
            demoted = sorted({*session.record.get("metadata", {}).get("auxiliary_seqs", []),
                              *(s for s in seqs if s in graph.nodes)})
            _demote(graph, demoted, reason)
            session.stats = graph.stats()
        session.record["metadata"] = {**session.record.get("metadata", {}),
                                      "auxiliary_seqs": demoted, "auxiliary_reason": reason}
        self.writes.submit_and_wait(self._store_metadata, session)
        self._publish_update(session)

    def _store_metadata(self, session: _Session) -> None:
        try:
            self.store.update_session(session.id, metadata=session.record["metadata"])
        except Exception as exc:  # an annotation lost to a store fault is logged, never raised
            log.warning("session %s: metadata not stored (%s)", session.id, exc)

    def findings(self, session_id: str) -> list[Finding]:
        """Session, turn and rollout findings."""
        session = self._get(session_id)
        with session.rw:
            graph = self._graph(session)
            out = list(session.findings)
            out.extend(graph.findings())
            out.extend(validate_rollout(
                graph, session.tier, rollout_type=session.record.get("rollout_type", "auto")))
        return out

    def rollout_document(self, session_id: str, *, lists: bool = True) -> dict[str, Any]:
        """The rollout document (turns, stats, sequences, findings, tier). `lists=False` keeps
        token arrays as numpy (for orjson's numpy serialisation: far faster on long rollouts)."""
        session = self._get(session_id)
        with session.rw:
            return rollout_document(self._record(session), self._graph(session), session.tier,
                                    lists=lists)

    def graph_view(self, session_id: str, since: int = 0) -> dict[str, Any]:
        """The graph without tokens: headers of turns from `since` on, links, stats, findings."""
        session = self._get(session_id)
        with session.rw:
            return graph_view(self._record(session), self._graph(session), session.tier,
                              since=since, findings=session.findings)

    def training_trace(self, session_id: str, *, lists: bool = True) -> dict[str, Any]:
        """The per-call training trace; refused (409) for an eval rollout. `lists` as above."""
        session = self._get(session_id)
        try:
            with session.rw:
                return training_trace(self._record(session), self._graph(session), session.tier,
                                      lists=lists)
        except ExportRefused as exc:
            raise SessionError(409, str(exc)) from exc

    def turn_detail(self, session_id: str, seq: int) -> dict[str, Any]:
        """Everything the TUI shows for one turn."""
        session = self._get(session_id)
        with session.rw:
            graph = self._graph(session)
            if seq not in graph.nodes:
                raise SessionError(404, f"session {session_id} has no turn {seq}")
            turn = graph.turn(seq)
            link = graph.link(seq)
            mask_on = graph.node_mask_on(seq)
        sampled = turn.sampled_ids
        prompt = turn.prompt_ids
        return {
            "seq": seq, "parent": link.parent, "link_kind": link.kind,
            "request": turn.request, "response": turn.response,
            "prompt_len": None if prompt is None else int(len(prompt)),
            "sampled_ids": None if sampled is None else sampled.tolist(),
            "token_texts": turn.token_texts,
            "logprobs": None if turn.logprobs is None else turn.logprobs.tolist(),
            "top_logprobs": turn.top_logprobs,
            "mask": None if sampled is None else [1 if mask_on else 0] * len(sampled),
            "finish_reason": turn.finish_reason,
            "findings": [f.model_dump(mode="json") for f in [*turn.findings, *link.findings]],
            "sampling": turn.sampling, "meta": turn.meta,
        }

    # ----------------------------------------------------------------- helpers

    def _get(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionError(404, f"no session {session_id}")
        return session

    def _record(self, session: _Session) -> dict[str, Any]:
        return {**session.record, "state": session.state, "turns": session.turns,
                "last_call_at": session.last_call_at}

    def _graph(self, session: _Session) -> RolloutGraph:
        """The session's graph. One that is not live (a restarted or closed session's) is
        rebuilt from the store for this use and not kept. Call on a thread, holding `rw`."""
        if session.graph is not None:
            return session.graph
        _record, graph = self.store.load_graph(session.id)
        session.fatal = session.warn = 0
        session.count([*session.findings, *graph.findings()])
        metadata = session.record.get("metadata") or {}
        _demote(graph, metadata.get("auxiliary_seqs") or [], metadata.get("auxiliary_reason", ""))
        session.turns = len(graph)
        session.stats = graph.stats()
        session.last_call_at = max((n.turn.created_at for n in graph.nodes.values()), default=None)
        if session.state == "open":
            session.graph = graph  # a live session's graph whose state a store fault dropped
        return graph

    def _stats(self, session: _Session) -> RolloutStats:
        """The cached stats; a restarted session's are computed once (on a thread)."""
        if session.stats is None:
            with session.rw:
                self._graph(session)
        assert session.stats is not None
        return session.stats

    def _summary(self, session: _Session) -> SessionSummary:
        now = time.time()
        # Turns counted on capture (the stats are those of the last linked turn).
        stats = {**self._stats(session).model_dump(), "turns": session.turns}
        return SessionSummary(
            **stats, id=session.id, state=session.state,
            tier=session.tier, rollout_type=session.record.get("rollout_type", "eval"),
            created_at=session.record.get("created_at", 0.0), last_call_at=session.last_call_at,
            seconds_since_last_call=None if session.last_call_at is None else now - session.last_call_at,
            metadata=session.record.get("metadata") or {}, fatal=session.fatal, warn=session.warn,
            engine=EngineRef(**(session.record.get("engine") or {"url": ""})))

    # ----------------------------------------------------------------- model calls

    def session_for_key(self, key: str | None) -> _Session | None:
        """The open session a key names (charset-checked before any lookup)."""
        if not key or not is_session_key(key):
            return None
        return self._by_key.get(key)

    def models_listing(self, headers: Mapping[str, str], query: Mapping[str, str]) -> CallReply:
        """`GET /v1/models` with a session key: the session's model only."""
        session = self.session_for_key(key_from_request(headers, query))
        if session is None:
            return _error(CHAT, 401, "unknown or closed session key", "authentication_error")
        name = session.served_model or "model"
        return CallReply(body={"object": "list", "data": [
            {"id": name, "object": "model", "created": int(session.record["created_at"]),
             "owned_by": "tapdeck"}]})

    async def handle_call(self, path: str, query: Mapping[str, str], headers: Mapping[str, str],
                          body: bytes | Callable[[], Awaitable[bytes]],
                          until_disconnect: Callable[[], Awaitable[None]] | None = None) -> CallReply:
        """Answer one harness request (any dialect); see the module docstring for the flow.

        `body` is the request body, or what reads it: then it is read only once the session key
        is known good, and its BodyTooLarge / BodyIncomplete are answered in the caller's dialect.

        `until_disconnect` completes when the client hangs up; the call is then cancelled (a
        stream that has started is cancelled by the HTTP layer stopping it). Every call, refused
        ones included, writes one access-log line (a stream's when it ends).
        """
        access = AccessRecord(path=path)
        token = CURRENT_CALL.set(access)
        try:
            reply = await self._handle(path, query, headers, body, until_disconnect, access)
        finally:
            CURRENT_CALL.reset(token)
        if reply.stream is None:
            access.status = reply.status
            access.error = access.error or reply.kind
            access.emit()
        else:
            reply.stream = _logged(reply.stream, access)
        return reply

    async def _handle(self, path: str, query: Mapping[str, str], headers: Mapping[str, str],
                      body: bytes | Callable[[], Awaitable[bytes]],
                      until_disconnect: Callable[[], Awaitable[None]] | None,
                      access: AccessRecord) -> CallReply:
        aux_kind = match_aux("POST", path)
        dialect = aux_dialect(aux_kind) if aux_kind else detect(path)
        if dialect is None:
            return _error(CHAT, 404, f"tapdeck does not serve POST {path}", "not_found_error")
        access.dialect = dialect.name
        session = self.session_for_key(key_from_request(headers, query))
        if session is None:
            return _error(dialect, 401, "unknown or closed session key: use the api_key tapdeck "
                                        "returned when the session was opened", "authentication_error")
        access.session_id = session.id
        try:
            raw = body if isinstance(body, bytes) else await body()
            payload = orjson.loads(raw) if raw else {}
        except BodyTooLarge as exc:
            return _error(dialect, 413, exc.message, "request_too_large")
        except BodyIncomplete:
            return _error(dialect, 400, "request body ended early", "invalid_request_error")
        except orjson.JSONDecodeError as exc:
            return _error(dialect, 400, f"request body is not valid JSON: {exc}", "invalid_request_error")
        if not isinstance(payload, dict):
            return _error(dialect, 400, "request body must be a JSON object", "invalid_request_error")
        if too_deep(payload):
            return _error(dialect, 400, f"request body nests deeper than {MAX_JSON_DEPTH} levels",
                          "invalid_request_error")
        if aux_kind:
            return await self._aux(session, dialect, aux_kind, payload)
        with arguments_memo(session.arguments):
            return await self._model_call(session, dialect, path, query, headers, payload,
                                          until_disconnect, access)

    async def _model_call(self, session: _Session, dialect: Dialect, path: str,
                          query: Mapping[str, str], headers: Mapping[str, str],
                          payload: dict[str, Any],
                          until_disconnect: Callable[[], Awaitable[None]] | None,
                          access: AccessRecord) -> CallReply:
        remember: Callable[[dict[str, Any]], None] | None = None
        try:
            if dialect is RESPONSES:
                # Stateful: a call naming a previous response gets the input that stands for.
                req = dialect.parse(session.stored_responses.expand(payload), path, query)
                remember = partial(session.stored_responses.remember, payload)
            else:
                req = dialect.parse(payload, path, query)
        except DialectError as exc:
            return _error(dialect, exc.status, exc.message, exc.kind, exc.param)
        except MALFORMED as exc:
            return _error(dialect, 400, malformed_message(exc), "invalid_request_error")
        meta = {"dialect": dialect.name, "client_model": req.client_model, "path": path}
        header_session = headers.get(SESSION_HEADER)
        if header_session:
            meta["header_session_id"] = header_session
        access.stream = req.stream
        task = asyncio.create_task(self._call(session, req, meta))
        try:
            # A stream is held until the engine answers or its first keepalive is due, so a call
            # that has already failed gets its real status (agents' SDKs retry on the status).
            reply = await _unless_disconnected(task, until_disconnect,
                                               timeout=self.keepalive_s if req.stream else None)
        except _CallFailed as exc:
            return _error(dialect, exc.status, exc.message, exc.kind)
        if req.stream:
            media = "application/json" if req.context.get("stream_format") == JSON_ARRAY \
                else "text/event-stream"
            return CallReply(stream=self._stream(session, dialect, req, task, access, remember),
                             media_type=media)
        assert reply is not None
        access.finish = _finish_reason(reply)
        rendered = dialect.render(reply, req)
        if remember is not None:
            remember(rendered)
        return CallReply(body=rendered)

    async def _aux(self, session: _Session, dialect: Dialect, kind: Any,
                   payload: dict[str, Any]) -> CallReply:
        """Token counts: answered from the session's engine (or estimated); never a turn."""
        assert session.engine is not None
        if self._aux_http is None:
            self._aux_http = httpx.AsyncClient()
        try:
            body, _method = await count_tokens(kind, payload, engine_url=session.engine.url,
                                               served_model=session.served_model,
                                               api_key=session.engine.api_key, client=self._aux_http)
        except DialectError as exc:
            return _error(dialect, exc.status, exc.message, exc.kind, exc.param)
        except MALFORMED as exc:
            return _error(dialect, 400, malformed_message(exc), "invalid_request_error")
        return CallReply(body=body)

    def _stream(self, session: _Session, dialect: Dialect, req: DialectRequest,
                task: asyncio.Task[dict[str, Any]],
                access: AccessRecord,
                remember: Callable[[dict[str, Any]], None] | None = None) -> AsyncIterator[bytes]:
        """The caller's stream for a call in flight: a keepalive at once when the engine is still
        working (the hold before the start already waited one interval), more while it works, then
        the whole reply, or the error as the dialect's in-stream error events. The HTTP layer
        closing the stream (client gone) cancels the engine call."""

        memo = session.arguments

        async def events() -> Iterable[SSEEvent]:
            try:
                reply = await task
            except _CallFailed as exc:
                access.error = f"{exc.kind}/{exc.status}-in-stream"
                return list(dialect.stream_error(exc.status, exc.message, exc.kind))
            access.finish = _finish_reason(reply)
            with arguments_memo(memo):
                if remember is not None:
                    remember(dialect.render(reply, req))
                return list(dialect.render_stream(reply, req))

        at_once = not task.done()
        if req.context.get("stream_format") == JSON_ARRAY:
            return json_array_with_keepalive(events(), interval=self.keepalive_s)
        # A dialect whose clients choke on SSE comments names its own keepalive bytes.
        keepalive = getattr(dialect, "sse_keepalive", None) or KEEPALIVE
        return stream_with_keepalive(events(), interval=self.keepalive_s, keepalive=keepalive,
                                     keepalive_at_once=at_once)

    async def _call(self, session: _Session, req: DialectRequest, meta: dict[str, Any]) -> dict[str, Any]:
        """One model call → a chat-completions reply (real, or a synthetic stop). Raises _CallFailed."""
        assert session.client is not None
        chat = dict(req.chat)
        try:
            fmt = json_format(chat)
            if session.fold_system:
                chat["messages"] = fold_system_messages(chat["messages"])
        except MALFORMED as exc:
            raise _CallFailed(400, malformed_message(exc), "invalid_request_error") from exc
        if self._budget_reached(session):
            return _stop_answer(BUDGET_STOP_TEXT.format(budget=session.call_budget), session, fmt)
        if fmt is not None:
            # Structured output marks an auxiliary call: never trained, so it may be constrained.
            meta = {**meta, "call_role": "auxiliary"}
        # No served name known (the probe could not list models): the client's name is the best
        # guess left; a wrong one comes back as the engine's own 404.
        served = session.served_model or req.client_model or "default"
        prepare = partial(session.client.prepare, tier=session.tier, served_model=served,
                          training=session.training and fmt is None,
                          alternatives=session.record.get("alternatives", 0),
                          policy=session.training_sampling)
        try:
            upstream, sampling = prepare(chat)
        except DialectError as exc:
            raise _CallFailed(exc.status, exc.message, exc.kind) from exc
        except MALFORMED as exc:
            raise _CallFailed(400, malformed_message(exc), "invalid_request_error") from exc
        # Re-checked with no await since: concurrent calls cannot overshoot the budget.
        if self._budget_reached(session):
            return _stop_answer(BUDGET_STOP_TEXT.format(budget=session.call_budget), session, fmt)
        # The slot is held until the turn is counted (or the call fails), so concurrent calls
        # never see a finished-but-uncounted call as free budget.
        slot = _Slot(session)
        try:
            with self.activity.call(session.id, chat, meta) as call:
                reply = await self._complete(session, req, meta, chat, fmt, prepare, upstream,
                                             sampling, slot)
                call.replied(reply)
            return reply
        finally:
            slot.release()
            if session.state != "open":
                self._release_if_idle(session)

    async def _complete(self, session: _Session, req: DialectRequest, meta: dict[str, Any],
                        chat: dict[str, Any], fmt: Any,
                        prepare: Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, Any]]],
                        upstream: dict[str, Any], sampling: dict[str, Any],
                        slot: _Slot) -> dict[str, Any]:
        """The engine call and the turn's record, for a call holding a budget slot."""
        assert session.client is not None
        started = time.perf_counter()
        plan: Plan | None = None
        try:
            try:
                if session.token_in is not None:
                    plan = await self._token_in_plan(session, req, upstream, fmt)
                    if (due := session.token_in.take_finding()) is not None:
                        await self._session_finding(session, due)
                    reply, plan = await session.token_in.send(upstream, plan)
                else:
                    reply = await session.client.complete(upstream)
            except EngineError as exc:
                if not (exc.kind == "upstream_4xx" and TEMPLATE_REFUSAL.search(exc.message)
                        and has_late_system(chat["messages"])):
                    raise
                # The chat template refuses system messages after the first turn: fold them into
                # the leading one, for this session's later calls too once that is answered.
                chat["messages"] = fold_system_messages(chat["messages"])
                upstream, sampling = prepare(chat)
                plan = Plan.text("system_folded") if plan is not None else None
                reply = await session.client.complete(upstream)
                session.fold_system = True
        except EngineError as exc:
            if exc.kind == "context_length":
                await self._session_finding(session, Finding.warn(
                    "context_full", f"engine refused the prompt as too long; answered with a stop "
                                    f"reply ({exc.message})"))
                return _stop_answer(CONTEXT_STOP_TEXT, session, fmt)
            if exc.kind in ENGINE_DOWN and not any(f.code == "engine_unreachable" for f in session.findings):
                # Once per session: what a rollout that failed is classified by.
                await self._session_finding(session, Finding.warn(
                    "engine_unreachable", f"{exc.kind}: {exc.message} (the agent got HTTP {exc.status})"))
            raise _CallFailed(exc.status, exc.message, exc.kind) from exc
        # The proxy's own reply id: an engine that repeats ids must not make two replies one
        # (a Responses chain naming itself as its own previous response would never end).
        reply = {**reply, "id": f"chatcmpl-tdk-{secrets.token_hex(12)}"}
        # The reply id kept with the turn ties what a harness logged to what was captured.
        meta = {**meta, "latency_ms": round((time.perf_counter() - started) * 1000, 3),
                "usage": reply.get("usage"), "reply_id": reply["id"]}
        if plan is not None:
            meta["capture_mode"] = plan.record
        findings = _cap_findings(sampling, reply)
        if session.token_in is not None and (thought := session.token_in.reply_finding(reply)):
            findings.append(thought)
        if chat["messages"] is not req.chat["messages"] and has_late_system(req.chat["messages"]):
            findings.append(Finding.warn(
                "system_folded", "the engine's chat template refuses system messages after the "
                                 "first turn, so this session's are folded into the leading system "
                                 "prompt: the prompt's start changes where one is added"))
            req.chat = {**req.chat, "messages": chat["messages"]}
        answer = reply
        if fmt is not None:
            answer, json_findings = answer_as_json(reply, fmt)
            findings.extend(json_findings)
        req.context["call_findings"] = findings
        # From here the engine did the work: record it even if the caller hangs up meanwhile.
        try:
            await asyncio.shield(self._record_turn(session, req, reply, sampling, meta, slot))
        except StoreUnavailable as exc:
            log.error("session %s: turn not recorded, the store refused it (%s)", session.id, exc.reason)
            raise _CallFailed(503, STORE_DOWN_TEXT.format(reason=exc.reason),
                              "store_unavailable") from exc
        return answer

    async def _token_in_plan(self, session: _Session, req: DialectRequest,
                             upstream: dict[str, Any], fmt: Any) -> Plan:
        """Token-in or text for this call (`proxy/token_in.py`); structured-output calls and
        calls whose system messages had to be folded take the text path."""
        assert session.token_in is not None
        if session.graph is None:  # dropped by a store fault this instant: nothing is held
            return Plan.text("not_held")
        if fmt is not None:
            return Plan.text("structured_output")
        if upstream["messages"] is not req.chat["messages"] and has_late_system(req.chat["messages"]):
            return Plan.text("system_folded")
        try:
            return await session.token_in.plan(session.graph, req.chat, upstream, lock=session.rw,
                                               offload=self.writes.run)
        except Exception as exc:  # a planning bug must cost the call its token-in, never the call
            log.exception("session %s: token-in planning failed", session.id)
            return Plan.text("planning_failed", detail=f"{type(exc).__name__}: {exc}")

    async def _session_finding(self, session: _Session, finding: Finding) -> None:
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
        self._publish_update(session)

    def _budget_reached(self, session: _Session) -> bool:
        return session.call_budget is not None and session.turns + session.in_flight >= session.call_budget

    async def _record_turn(self, session: _Session, req: DialectRequest, reply: dict[str, Any],
                           sampling: dict[str, Any], meta: dict[str, Any], slot: _Slot) -> None:
        cap = EngineClient.parse_capture(reply)
        choice = (reply.get("choices") or [{}])[0]
        async with session.lock:
            interned = session.interner.intern(req.chat)
            turn = Turn(session_id=session.id, seq=session.turns, prompt_ids=cap.prompt_ids,
                        sampled_ids=cap.sampled_ids, logprobs=cap.logprobs,
                        finish_reason=choice.get("finish_reason"), request=interned.request,
                        content_keys=interned.keys,
                        response=choice.get("message") or {}, sampling=sampling,
                        token_texts=cap.token_texts, top_logprobs=cap.top_logprobs,
                        findings=[*cap.findings, *_request_findings(req)], meta=meta)
            # Validated before linking: the graph decides trainability from the turn's findings.
            turn.findings.extend(validate_turn(turn, session.tier))
            link = await self.writes.run(self._commit_turn, session, turn)
            # Counted only once on disk, in one step with the slot's release (no await between).
            session.turns += 1
            slot.release()
            session.last_call_at = turn.created_at
            access = CURRENT_CALL.get()
            if access is not None:
                access.seq = turn.seq
            session.count([*turn.findings, *link.findings])

        def captured() -> dict[str, Any]:  # built only when someone listens
            header = TurnHeader(
                seq=turn.seq, parent=link.parent, link_kind=link.kind, link_offset=link.offset,
                capture_mode=capture_mode(turn.meta),
                prompt_len=None if cap.prompt_ids is None else len(cap.prompt_ids),
                sampled_len=None if cap.sampled_ids is None else len(cap.sampled_ids),
                finish_reason=turn.finish_reason, created_at=turn.created_at,
                findings=[*turn.findings, *link.findings])
            return TurnCaptured(turn=header, session=self._summary(session)).model_dump(mode="json")
        self.events.publish(captured)

    def _commit_turn(self, session: _Session, turn: Turn) -> Link:
        """Link the turn and commit it, as one step under the graph's lock (on a store thread).

        A failed commit puts back the graph as the store has it, so nothing in memory holds a
        turn the disk does not."""
        with session.rw:
            graph = self._graph(session)
            link = graph.add(turn)
            try:
                self.store.append_turn(turn, link)
            except BaseException:
                session.graph = None
                with contextlib.suppress(Exception):  # else rebuilt on next use
                    self._graph(session)
                raise
            session.stats = graph.stats()
        return link

    def _publish_update(self, session: _Session) -> None:
        self.events.publish(lambda: SessionUpdated(session=self._summary(session)).model_dump(mode="json"))


async def _unless_disconnected(task: asyncio.Task[dict[str, Any]],
                               until_disconnect: Callable[[], Awaitable[None]] | None,
                               timeout: float | None = None) -> dict[str, Any] | None:
    """Await the call, cancelling it if the client hangs up first; None when `timeout` passes
    first (the call goes on)."""
    watcher = asyncio.ensure_future(until_disconnect()) if until_disconnect is not None else None
    try:
        await asyncio.wait({task} if watcher is None else {task, watcher}, timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        if watcher is not None:
            watcher.cancel()
    if task.done():
        return task.result()
    if watcher is not None and watcher.done():
        task.cancel()
        raise _CallFailed(499, "client closed the request", "client_closed")
    return None


async def _logged(stream: AsyncIterator[bytes], access: AccessRecord) -> AsyncIterator[bytes]:
    """The stream, with the call's access line written when it ends (or the client leaves)."""
    access.status = 200
    try:
        async with contextlib.aclosing(stream) as chunks:  # type: ignore[type-var]
            async for chunk in chunks:
                yield chunk
    except BaseException:
        access.error = access.error or "client_closed"
        raise
    finally:
        access.emit()


def _demote(graph: RolloutGraph, seqs: Iterable[int], reason: str) -> None:
    """Mark these calls auxiliary in the graph (the role the graph reads from `meta.call_role`)."""
    for seq in seqs:
        if seq in graph.nodes:
            graph.turn(seq).meta.update(call_role="auxiliary", auxiliary_reason=reason)


def _stored_stats(value: Any) -> RolloutStats | None:
    """Stats a clean close stored with the session (None when absent or of another shape: they
    are then computed from the turns once)."""
    if not isinstance(value, dict):
        return None
    try:
        return RolloutStats.model_validate(value)
    except ValidationError:
        return None


class _Slot:
    """One call's place in its session's in-flight count, given back exactly once."""

    __slots__ = ("held", "session")

    def __init__(self, session: _Session) -> None:
        self.session = session
        self.held = True
        session.in_flight += 1

    def release(self) -> None:
        if self.held:
            self.held = False
            self.session.in_flight -= 1


def _finish_reason(reply: Mapping[str, Any]) -> str | None:
    choice = (reply.get("choices") or [{}])[0] or {}
    if reply.get("tapdeck_synthetic"):
        return "tapdeck_stop"
    return choice.get("finish_reason")


def _request_findings(req: DialectRequest) -> list[Finding]:
    """What the dialect had to leave out of the request, and what the call changed, as turn findings."""
    out = list(req.context.get("call_findings") or [])
    dropped = req.context.get("dropped_tools") or []
    if dropped:
        out.append(Finding.warn("dropped_tools", f"{', '.join(dropped)} (the engine cannot run hosted tools)"))
    return out


def _cap_findings(sampling: Mapping[str, Any], reply: Mapping[str, Any]) -> list[Finding]:
    """`max_tokens_capped` when the proxy lowered the agent's output limit; a WARN when the reply
    was then cut at the lowered limit (the agent sees the truncation in its dialect's own terms:
    finish_reason length, stop_reason max_tokens, finishReason MAX_TOKENS, response.incomplete)."""
    out = []
    for key in ("max_tokens", "max_completion_tokens"):
        asked, sent = sampling.get("requested", {}).get(key), sampling.get("submitted", {}).get(key)
        if not (isinstance(asked, int) and isinstance(sent, int) and asked > sent):
            continue
        choice = (reply.get("choices") or [{}])[0] or {}
        if choice.get("finish_reason") == "length":
            out.append(Finding.warn("max_tokens_capped", f"the agent asked for {key}={asked}; the engine "
                                                         f"was sent {sent} and the reply was cut there"))
        else:
            out.append(Finding.info("max_tokens_capped", f"the agent asked for {key}={asked}; the "
                                                         f"engine was sent {sent} (the proxy's cap)"))
    return out


def _error(dialect: Dialect, status: int, message: str, kind: str, param: str | None = None) -> CallReply:
    return CallReply(status=status, body=dialect.error_body(status, message, kind, param), kind=kind)


def _stop_answer(text: str, session: _Session, fmt: Any) -> dict[str, Any]:
    """A synthetic stop reply; JSON for a structured-output call (gemini-cli retries a router or
    next-speaker call answered in prose for minutes)."""
    reply = _stop_reply(text, session)
    return reply if fmt is None else answer_as_json(reply, fmt)[0]


def _stop_reply(text: str, session: _Session) -> dict[str, Any]:
    """A chat-completions reply that ends the conversation; never becomes a node."""
    return {
        "id": f"chatcmpl-tapdeck-{time.time_ns():x}", "object": "chat.completion",
        "created": int(time.time()), "model": session.served_model or "model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        "tapdeck_synthetic": True,
    }


__all__ = ["CallReply", "CaptureService"]
