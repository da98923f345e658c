"""What `GET /admin/events` streams: every event type, named here and nowhere else.

Publishers build these models; the bus sends `model_dump(mode="json")`; clients read each line
back with `parse_event` (an event of a type this client does not know is skipped, not an error).
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter

from tapdeck.schema.runs import RolloutResult, RunSummary
from tapdeck.schema.sessions import SessionSummary, TurnHeader


class _Event(BaseModel):
    ts: float = Field(default_factory=time.time)
    """When the server published it (its clock)."""


class SessionOpened(_Event):
    """A capture session was opened."""

    type: Literal["session_opened"] = "session_opened"
    session: SessionSummary


class SessionUpdated(_Event):
    """A session's summary changed (the runner annotated it, calls were demoted)."""

    type: Literal["session_updated"] = "session_updated"
    session: SessionSummary


class SessionClosed(_Event):
    """A capture session was closed."""

    type: Literal["session_closed"] = "session_closed"
    session: SessionSummary


class TurnCaptured(_Event):
    """A model call was captured and linked: the turn's header (no tokens) and the new summary."""

    type: Literal["turn_captured"] = "turn_captured"
    turn: TurnHeader
    session: SessionSummary


class RunStarted(_Event):
    """A run started (or resumed) with `pending` rollouts to go."""

    type: Literal["run_started"] = "run_started"
    run_id: str
    run: RunSummary
    pending: int


class RolloutUpdated(_Event):
    """A rollout moved (phase, progress line) or finished (then `run` is the run's new summary)."""

    type: Literal["rollout_updated"] = "rollout_updated"
    run_id: str | None
    rollout: RolloutResult
    run: RunSummary | None = None


class RunFinished(_Event):
    """A run ended (finished, cancelled or failed)."""

    type: Literal["run_finished"] = "run_finished"
    run_id: str
    run: RunSummary


_EVENTS = (
    SessionOpened,
    SessionUpdated,
    SessionClosed,
    TurnCaptured,
    RunStarted,
    RolloutUpdated,
    RunFinished,
)
Event = Annotated[
    SessionOpened | SessionUpdated | SessionClosed | TurnCaptured | RunStarted | RolloutUpdated | RunFinished,
    Field(discriminator="type"),
]
EVENT_TYPES: frozenset[str] = frozenset(m.model_fields["type"].default for m in _EVENTS)
_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def parse_event(data: object) -> Event | None:
    """One event from its JSON (a dict); None for a type this schema does not know."""
    if not isinstance(data, dict) or data.get("type") not in EVENT_TYPES:
        return None
    return _ADAPTER.validate_python(data)
