"""What each session's agent is doing now, for an operator looking at a stuck rollout.

The capture path tells `ActivityLog` when a model call goes upstream and when it comes back; the
admin API reads a `SessionActivity` snapshot. Only the last exchange is held per session (message
texts cut to their tails), never the conversation: the store has that. A closed session's entry
is kept for the TUI's pane (why did that rollout end?), but only the last `CLOSED_KEPT` of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tapdeck.schema.activity import InFlightCall, MessageView, SessionActivity, ToolCallView

TEXT_TAIL = 2000
"""Characters kept of a message: its tail, where a command's output ends."""
ARGUMENTS_MAX = 500
RECENT_ENDS = 240
"""Call end times kept per session (the calls-per-second picture)."""
CLOSED_KEPT = 256
"""Closed sessions whose last exchange stays readable (the newest closed)."""


@dataclass
class _SessionState:
    record: SessionActivity
    """Counts and the last exchange, updated in place (`now`, `in_flight`, `recent_ends` are
    filled in by `snapshot`)."""
    in_flight: dict[int, InFlightCall] = field(default_factory=dict)
    recent_ends: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_ENDS))


class ActivityCall:
    """One call in flight; `replied(reply)` records the engine's answer before the call ends."""

    def __init__(self, record: SessionActivity, in_flight: InFlightCall, clock: Callable[[], float]) -> None:
        # The record itself, not its session id: a reply never re-creates a released entry.
        self._record = record
        self._in_flight = in_flight
        self._clock = clock

    def engine_updating(self, waiting: bool) -> None:
        """The engine refuses the call while it updates (the proxy resends it), or no longer does."""
        self._in_flight.engine_updating_since = self._clock() if waiting else None

    def replied(self, reply: Mapping[str, Any]) -> None:
        """Take a chat-completions reply: its message becomes the last assistant message."""
        record = self._record
        choice = (reply.get("choices") or [{}])[0]
        message = choice.get("message")
        if isinstance(message, Mapping):
            take_assistant(record, message)
        record.last_finish_reason = choice.get("finish_reason")


class ActivityLog:
    """Per-session live activity; every method runs on the server's loop."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._sessions: dict[str, _SessionState] = {}
        self._closed: OrderedDict[str, _SessionState] = OrderedDict()
        """Closed sessions' entries, oldest closed first (at most CLOSED_KEPT)."""
        self._ids = itertools.count()

    def state(self, session_id: str) -> _SessionState:
        """The session's live state (made on first use)."""
        state = self._sessions.get(session_id)
        if state is None:
            state = self._sessions[session_id] = _SessionState(
                SessionActivity(session_id=session_id, now=0.0)
            )
        return state

    @contextlib.contextmanager
    def call(
        self, session_id: str, chat: Mapping[str, Any], meta: Mapping[str, Any]
    ) -> Iterator[ActivityCall]:
        """Mark a call in flight for the duration of the block; an exception is its error."""
        state = self.state(session_id)
        record = state.record
        call_id = next(self._ids)
        messages = chat.get("messages") or []
        in_flight = state.in_flight[call_id] = InFlightCall(
            call_id=call_id,
            started_at=self.clock(),
            dialect=meta.get("dialect"),
            path=meta.get("path"),
            messages=len(messages),
        )
        record.calls_started += 1
        _take_prompt(record, messages)
        try:
            yield ActivityCall(record, in_flight, self.clock)
        except asyncio.CancelledError:
            record.errors += 1
            record.last_error = "cancelled (the caller hung up, or its rollout ended)"
            raise
        except Exception as exc:
            record.errors += 1
            record.last_error = getattr(exc, "message", None) or type(exc).__name__
            raise
        finally:
            state.in_flight.pop(call_id, None)
            record.calls_ended += 1
            record.last_ended_at = self.clock()
            state.recent_ends.append(record.last_ended_at)

    def closed(self, session_id: str) -> None:
        """The session takes no more calls: keep its entry among the last CLOSED_KEPT closed ones."""
        state = self._sessions.pop(session_id, None)
        if state is None:
            return
        self._closed[session_id] = state
        if len(self._closed) > CLOSED_KEPT:
            self._closed.popitem(last=False)

    def snapshot(self, session_id: str) -> SessionActivity:
        """What the session is doing now (an empty record for a session that never called, or
        one closed before the last CLOSED_KEPT)."""
        state = self._sessions.get(session_id) or self._closed.get(session_id)
        if state is None:
            return SessionActivity(session_id=session_id, now=self.clock())
        return state.record.model_copy(
            update={
                "now": self.clock(),
                "recent_ends": list(state.recent_ends),
                "in_flight": sorted(state.in_flight.values(), key=lambda c: c.started_at),
            }
        )


def _take_prompt(record: SessionActivity, messages: Sequence[Any]) -> None:
    """The prompt's newest observation, and its newest assistant message unless a reply is newer."""
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") in ("tool", "user"):
            record.last_observation = message_view(message)
            break
    if record.calls_ended == 0:
        for message in reversed(messages):
            if isinstance(message, Mapping) and message.get("role") == "assistant":
                take_assistant(record, message)
                break


def take_assistant(record: SessionActivity, message: Mapping[str, Any]) -> None:
    """An assistant message becomes the last one (and its last tool call, if it made one)."""
    view = message_view(message)
    record.last_assistant = view
    if view.tool_calls:
        record.last_tool_call = view.tool_calls[-1]


def message_view(message: Mapping[str, Any]) -> MessageView:
    """A chat message as text (content parts joined), cut to its tail, with its tool calls."""
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(
            str(part.get("text", "")) if isinstance(part, Mapping) else str(part) for part in content
        )
    text = str(content or "")
    calls = []
    given = message.get("tool_calls")  # the call's own body: the view reads it, never refuses it
    for call in given if isinstance(given, list) else []:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            calls.append(
                ToolCallView(
                    name=str(function.get("name") or "?"),
                    arguments=str(function.get("arguments") or "")[:ARGUMENTS_MAX],
                )
            )
    return MessageView(
        role=str(message.get("role") or "?"),
        text=text[-TEXT_TAIL:],
        tool_calls=calls,
        truncated=len(text) > TEXT_TAIL,
    )
