"""One model call's engine side: budget, the upstream request, the engine call, the recorded turn.

The turn is linked into the session's rollout graph and committed to the store together, on a
store thread, before the caller gets its reply: the graph, the counters and the exports only ever
hold what is on disk. A store that cannot commit (disk full, read-only, locked) fails the call
with 503; an engine that refuses or cannot answer fails it with the engine's own status and kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

from tapdeck.proxy.capture.export import capture_mode
from tapdeck.proxy.capture.graph import Link
from tapdeck.proxy.capture.policy_stamp import PolicyStamp
from tapdeck.proxy.capture.turn import Turn
from tapdeck.proxy.capture.validation import validate_turn
from tapdeck.proxy.config import DEFAULT_ENGINE_UPDATE_WAIT_S
from tapdeck.proxy.dialects.arguments import not_object_findings
from tapdeck.proxy.dialects.base import DialectError, DialectRequest
from tapdeck.proxy.dialects.chat import fold_system_messages, has_late_system
from tapdeck.proxy.http.access_log import CURRENT_CALL
from tapdeck.proxy.http.limits import MALFORMED, malformed_message
from tapdeck.proxy.http.token_counts import forget_engine
from tapdeck.proxy.sessions.activity import ActivityCall, ActivityLog
from tapdeck.proxy.sessions.live import CallSlot, LiveSession
from tapdeck.proxy.sessions.registry import SessionRegistry
from tapdeck.proxy.store.writes import StoreUnavailable
from tapdeck.proxy.upstream.client import EngineError
from tapdeck.proxy.upstream.json_mode import answer_as_json, json_format
from tapdeck.proxy.upstream.policy_versions import CallWatch
from tapdeck.proxy.upstream.reply_check import CheckedReply, check_reply
from tapdeck.proxy.upstream.tiers import PROBES
from tapdeck.proxy.upstream.token_in import Plan
from tapdeck.proxy.upstream.update_wait import through_update
from tapdeck.schema.events import TurnCaptured
from tapdeck.schema.findings import Finding
from tapdeck.schema.sessions import TurnHeader

log = logging.getLogger("tapdeck.proxy")

BUDGET_STOP_TEXT = (
    "[tapdeck] This session's model-call budget ({budget} calls) is used up; the conversation ends here."
)
CONTEXT_STOP_TEXT = (
    "[tapdeck] The conversation no longer fits the model's context window; the conversation ends here."
)
TEMPLATE_REFUSAL = re.compile(r"system|role|alternate|template", re.IGNORECASE)
"""What an engine's 400 says when its chat template refuses a message's place (vLLM passes the
template's own words: "System message must be at the beginning.", "Conversation roles must
alternate user/assistant/...")."""
ENGINE_DOWN = ("unreachable", "timeout", "bad_reply", "upstream_5xx")
"""Engine failure kinds that mean the engine cannot serve (not a request it refused)."""
STORE_DOWN_TEXT = (
    "tapdeck could not record this call ({reason}); nothing of it was kept. "
    "Retry once the capture store can write again."
)


class CallCapture:
    """Sends a session's model calls to its engine and records each reply as a turn."""

    def __init__(
        self,
        registry: SessionRegistry,
        activity: ActivityLog,
        *,
        engine_update_wait_s: float = DEFAULT_ENGINE_UPDATE_WAIT_S,
    ) -> None:
        self.registry = registry
        self.activity = activity
        self.engine_update_wait_s = engine_update_wait_s
        """How long a call the engine refuses with a 503 is resent (proxy/upstream/update_wait.py)."""

    async def call(self, session: LiveSession, req: DialectRequest, meta: dict[str, Any]) -> dict[str, Any]:
        """One model call → a chat-completions reply (real, or a synthetic stop). Raises a ProxyError."""
        assert session.client is not None
        chat = dict(req.chat)
        try:
            fmt = json_format(chat)
            if session.fold_system:
                chat["messages"] = fold_system_messages(chat["messages"])
        except MALFORMED as exc:
            raise DialectError(400, malformed_message(exc)) from exc
        if session.budget_reached():
            return _stop_answer(BUDGET_STOP_TEXT.format(budget=session.call_budget), session, fmt)
        if fmt is not None:
            # Structured output marks an auxiliary call: never trained, so it may be constrained.
            meta = {**meta, "call_role": "auxiliary"}
        # No served name known (the probe could not list models): the client's name is the best
        # guess left; a wrong one comes back as the engine's own 404.
        served = session.served_model or req.client_model or "default"
        prepare = partial(
            session.client.prepare,
            tier=session.tier,
            served_model=served,
            training=session.training and fmt is None,
            alternatives=session.record.get("alternatives", 0),
            policy=session.training_sampling,
            output_limit=session.output_limit,
        )
        try:
            upstream, sampling = prepare(chat)
        except MALFORMED as exc:
            raise DialectError(400, malformed_message(exc)) from exc
        # Re-checked with no await since: concurrent calls cannot overshoot the budget.
        if session.budget_reached():
            return _stop_answer(BUDGET_STOP_TEXT.format(budget=session.call_budget), session, fmt)
        # The slot is held until the turn is counted (or the call fails), so concurrent calls
        # never see a finished-but-uncounted call as free budget.
        slot = CallSlot(session)
        self.registry.publish_update(session)  # the board's "calling" age starts now
        try:
            with self.activity.call(session.id, chat, meta) as call:
                reply = await self._complete(
                    session, req, meta, chat, fmt, prepare, upstream, sampling, slot, call
                )
                call.replied(reply)
            return reply
        finally:
            recording = slot.recording
            if recording is not None and not recording.done():
                # The caller left while its turn is being recorded: the place, and a closed
                # session's release, wait for the record (the store and the graph still need it).
                recording.add_done_callback(partial(self._recorded_late, session, slot))
            else:
                self._give_back(session, slot)

    def _recorded_late(self, session: LiveSession, slot: CallSlot, recording: asyncio.Future[None]) -> None:
        if not recording.cancelled() and (exc := recording.exception()) is not None:
            log.error(
                "session %s: the turn of a call whose caller had left was not recorded (%s)", session.id, exc
            )
        self._give_back(session, slot)

    def _give_back(self, session: LiveSession, slot: CallSlot) -> None:
        unanswered = slot.held  # a captured turn released its slot, and its event said so
        slot.release()
        if session.state != "open":
            self.registry.release_if_idle(session)
        if unanswered:
            self.registry.publish_update(session)  # the call failed: no longer in flight

    async def _complete(
        self,
        session: LiveSession,
        req: DialectRequest,
        meta: dict[str, Any],
        chat: dict[str, Any],
        fmt: Any,
        prepare: Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, Any]]],
        upstream: dict[str, Any],
        sampling: dict[str, Any],
        slot: CallSlot,
        call: ActivityCall,
    ) -> dict[str, Any]:
        """The engine call and the turn's record, for a call holding a budget slot."""
        assert session.client is not None
        client = session.client
        started = time.perf_counter()
        plan: Plan | None = None
        watch: CallWatch | None = None

        async def watched[R](send: Callable[[], Awaitable[R]]) -> R:
            # The version readings before each attempt (`stamp` takes those after it): a call the
            # engine refused while it updated is answered by the weights it updated to.
            nonlocal watch
            watch = await self.registry.versions.watch(client)
            return await send()

        def awaiting(waiting: bool) -> None:
            call.engine_updating(waiting)
            session.awaiting_engine += 1 if waiting else -1
            self.registry.publish_update(session)

        def complete(body: dict[str, Any]) -> Awaitable[dict[str, Any]]:
            # Resent while the engine refuses it as it updates: the board says "engine updating".
            send = partial(watched, partial(client.complete, body, session.prompt_ids))
            return through_update(send, self.engine_update_wait_s, awaiting)

        try:
            try:
                if session.token_in is not None:
                    token_in = session.token_in
                    plan = await self._token_in_plan(session, req, upstream, fmt)
                    if (due := token_in.take_finding()) is not None:
                        await self.registry.add_finding(session, due)
                    reply, plan = await through_update(
                        partial(watched, partial(token_in.send, upstream, plan, session.prompt_ids)),
                        self.engine_update_wait_s,
                        awaiting,
                    )
                else:
                    reply = await complete(upstream)
            except EngineError as exc:
                if not (
                    exc.kind == "upstream_4xx"
                    and TEMPLATE_REFUSAL.search(exc.message)
                    and has_late_system(chat["messages"])
                ):
                    raise
                # The chat template refuses system messages after the first turn: fold them into
                # the leading one, for this session's later calls too once that is answered.
                chat["messages"] = fold_system_messages(chat["messages"])
                upstream, sampling = prepare(chat)
                plan = Plan.text("system_folded") if plan is not None else None
                reply = await complete(upstream)
                session.fold_system = True
            checked = check_reply(reply, session.client.shown)
        except EngineError as exc:
            if exc.kind == "context_length":
                await self.registry.add_finding(
                    session,
                    Finding.warn(
                        "context_full",
                        f"engine refused the prompt as too long; answered with a stop reply ({exc.message})",
                    ),
                )
                return _stop_answer(CONTEXT_STOP_TEXT, session, fmt)
            if exc.kind == "unreachable":
                # An engine restarts through refusing connections, maybe with other flags
                # (logprobs, token ids, /tokenize): the next session probes it again rather than
                # trust its old tier. Not on a timeout or a 5xx: a busy engine keeps its tier.
                PROBES.forget(session.client.spec)
                forget_engine(session.client.spec.url)
                self.registry.versions.forget(session.client.url)
            if exc.kind in ENGINE_DOWN and not any(f.code == "engine_unreachable" for f in session.findings):
                # Once per session: what a rollout that failed is classified by.
                await self.registry.add_finding(
                    session,
                    Finding.warn(
                        "engine_unreachable", f"{exc.kind}: {exc.message} (the agent got HTTP {exc.status})"
                    ),
                )
            raise
        assert watch is not None  # every answered call made an attempt
        policy = await watch.stamp(checked.reply)
        # The proxy's own reply id: an engine that repeats ids must not make two replies one
        # (a Responses chain naming itself as its own previous response would never end).
        reply = {**checked.reply, "id": f"chatcmpl-tdk-{secrets.token_hex(12)}"}
        # The reply id kept with the turn ties what a harness logged to what was captured.
        meta = {
            **meta,
            "latency_ms": round((time.perf_counter() - started) * 1000, 3),
            "usage": reply.get("usage"),
            "reply_id": reply["id"],
        }
        if plan is not None:
            meta["capture_mode"] = plan.record
        stop = ((reply.get("choices") or [{}])[0] or {}).get("stop_reason")
        if isinstance(stop, str):
            # The string's sampled tokens are not in the reply's text: the graph names the break.
            meta["stop_string"] = stop
        findings = _cap_findings(sampling, reply)
        if policy is not None and (straddle := policy.finding()) is not None:
            findings.append(straddle)
        if session.training and fmt is None and (greedy := _greedy_finding(sampling)) is not None:
            findings.append(greedy)
        if req.context.get("object_arguments"):
            findings.extend(not_object_findings(reply))
        if session.token_in is not None and (thought := session.token_in.reply_finding(reply)):
            findings.append(thought)
        if chat["messages"] is not req.chat["messages"] and has_late_system(req.chat["messages"]):
            findings.append(
                Finding.warn(
                    "system_folded",
                    "the engine's chat template refuses system messages after the "
                    "first turn, so this session's are folded into the leading system "
                    "prompt: the prompt's start changes where one is added",
                )
            )
            req.chat = {**req.chat, "messages": chat["messages"]}
        answer = reply
        if fmt is not None:
            answer, json_findings = answer_as_json(reply, fmt)
            findings.extend(json_findings)
        req.context["call_findings"] = findings
        # From here the engine did the work: record it even if the caller hangs up meanwhile.
        try:
            slot.recording = asyncio.ensure_future(
                self._record_turn(session, req, reply, checked, sampling, meta, slot, policy)
            )
            await asyncio.shield(slot.recording)
        except StoreUnavailable as exc:
            log.error("session %s: turn not recorded, the store refused it (%s)", session.id, exc.reason)
            raise StoreUnavailable(STORE_DOWN_TEXT.format(reason=exc.reason)) from exc
        return answer

    async def _token_in_plan(
        self, session: LiveSession, req: DialectRequest, upstream: dict[str, Any], fmt: Any
    ) -> Plan:
        """Token-in or text for this call (`proxy/upstream/token_in.py`); structured-output calls and
        calls whose system messages had to be folded take the text path."""
        assert session.token_in is not None
        if session.graph is None:  # dropped by a store fault this instant: nothing is held
            return Plan.text("not_held")
        if fmt is not None:
            return Plan.text("structured_output")
        if upstream["messages"] is not req.chat["messages"] and has_late_system(req.chat["messages"]):
            return Plan.text("system_folded")
        try:
            return await session.token_in.plan(
                session.graph, req.chat, upstream, lock=session.rw, offload=self.registry.writes.run
            )
        except Exception as exc:  # a planning bug must cost the call its token-in, never the call
            log.exception("session %s: token-in planning failed", session.id)
            return Plan.text("planning_failed", detail=f"{type(exc).__name__}: {exc}")

    async def _record_turn(
        self,
        session: LiveSession,
        req: DialectRequest,
        reply: dict[str, Any],
        checked: CheckedReply,
        sampling: dict[str, Any],
        meta: dict[str, Any],
        slot: CallSlot,
        policy: PolicyStamp | None,
    ) -> None:
        cap = checked.capture
        choice = reply["choices"][0]
        async with session.lock:
            interned = session.interner.intern(req.chat)
            turn = Turn(
                session_id=session.id,
                seq=session.turns,
                prompt_ids=cap.prompt_ids,
                sampled_ids=cap.sampled_ids,
                logprobs=cap.logprobs,
                routed_experts=cap.routed_experts,
                finish_reason=choice.get("finish_reason"),
                request=interned.request,
                content_keys=interned.keys,
                response=choice.get("message") or {},
                sampling=sampling,
                token_texts=cap.token_texts,
                top_logprobs=cap.top_logprobs,
                findings=[
                    f if f.turn is not None else f.model_copy(update={"turn": session.turns})
                    for f in (*cap.findings, *checked.findings, *_request_findings(req))
                ],
                meta=meta,
                policy=policy,
            )
            # Validated before linking: the graph decides trainability from the turn's findings.
            turn.findings.extend(validate_turn(turn, session.tier))
            link = await self.registry.writes.run(self._commit_turn, session, turn)
            # Counted only once on disk, in one step with the slot's release (no await between).
            session.turns += 1
            slot.release()
            session.last_call_at = turn.created_at
            session.policy.add(policy)
            access = CURRENT_CALL.get()
            if access is not None:
                access.seq = turn.seq
            session.count([*turn.findings, *link.findings])

        def captured() -> dict[str, Any]:  # built only when someone listens
            header = TurnHeader(
                seq=turn.seq,
                parent=link.parent,
                link_kind=link.kind,
                link_offset=link.offset,
                capture_mode=capture_mode(turn.meta),
                prompt_len=None if cap.prompt_ids is None else len(cap.prompt_ids),
                sampled_len=None if cap.sampled_ids is None else len(cap.sampled_ids),
                finish_reason=turn.finish_reason,
                created_at=turn.created_at,
                findings=[*turn.findings, *link.findings],
                **({} if policy is None else policy.fields()),
            )
            return TurnCaptured(turn=header, session=self.registry.summary(session)).model_dump(mode="json")

        self.registry.events.publish(captured)

    def _commit_turn(self, session: LiveSession, turn: Turn) -> Link:
        """Link the turn and commit it, as one step under the graph's lock (on a store thread).

        A failed commit puts back the graph as the store has it, so nothing in memory holds a
        turn the disk does not."""
        with session.rw:
            graph = self.registry.graph(session)
            link = graph.add(turn)
            try:
                self.registry.store.append_turn(turn, link)
            except BaseException:
                session.graph = None
                with contextlib.suppress(Exception):  # else rebuilt on next use
                    self.registry.graph(session)
                raise
            session.stats = graph.stats()
        return link


def _request_findings(req: DialectRequest) -> list[Finding]:
    """What the dialect had to leave out of the request, and what the call changed, as turn findings."""
    out = list(req.context.get("call_findings") or [])
    dropped = req.context.get("dropped_tools") or []
    if dropped:
        out.append(
            Finding.warn("dropped_tools", f"{', '.join(dropped)} (the engine cannot run hosted tools)")
        )
    if loosened := req.context.get("loosened_tool_choice"):
        out.append(Finding.warn("tool_choice_loosened", loosened))
    if parts := req.context.get("dropped_parts"):
        out.append(
            Finding.warn(
                "part_dropped",
                f"left out of the prompt, holding nothing an engine can read: {'; '.join(parts)}",
            )
        )
    return out


def _greedy_finding(sampling: Mapping[str, Any]) -> Finding | None:
    """A WARN for a training turn sampled at temperature 0: argmax picked its tokens, not the
    distribution its logprobs describe, and a group of such rollouts cannot differ."""
    temperature = sampling.get("submitted", {}).get("temperature")
    if isinstance(temperature, int | float) and not isinstance(temperature, bool) and temperature <= 0:
        return Finding.warn(
            "greedy_sampling",
            f"sampled at temperature {temperature} (greedy) in a "
            "training session: its tokens were not drawn from the "
            "policy its logprobs describe; give the rollout a "
            "temperature (the temperature setting, or training_sampling)",
        )
    return None


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
            out.append(
                Finding.warn(
                    "max_tokens_capped",
                    f"the agent asked for {key}={asked}; the engine "
                    f"was sent {sent} and the reply was cut there",
                )
            )
        else:
            out.append(
                Finding.info(
                    "max_tokens_capped",
                    f"the agent asked for {key}={asked}; the engine was sent {sent} (the proxy's cap)",
                )
            )
    return out


def _stop_answer(text: str, session: LiveSession, fmt: Any) -> dict[str, Any]:
    """A synthetic stop reply; JSON for a structured-output call (gemini-cli retries a router or
    next-speaker call answered in prose for minutes)."""
    reply = _stop_reply(text, session)
    return reply if fmt is None else answer_as_json(reply, fmt)[0]


def _stop_reply(text: str, session: LiveSession) -> dict[str, Any]:
    """A chat-completions reply that ends the conversation; never becomes a node."""
    return {
        "id": f"chatcmpl-tapdeck-{time.time_ns():x}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": session.served_model or "model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        "tapdeck_synthetic": True,
    }


__all__ = ["BUDGET_STOP_TEXT", "CONTEXT_STOP_TEXT", "CallCapture"]
