"""`GET /admin/sessions/{id}/activity`: what a session's agent is doing right now.

Built by the proxy (`tapdeck.proxy.sessions.activity`) from the calls it relays, read by the TUI's
stuck-rollout pane. Times are the server's wall clock; `now` lets a client turn them into ages
without trusting its own clock.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class ToolCallView(BaseModel):
    """One tool call an assistant message made (arguments as the model wrote them, cut short)."""

    name: str
    arguments: str = ""


class MessageView(BaseModel):
    """One chat message, flattened to text and cut to its tail."""

    role: str
    text: str = ""
    tool_calls: list[ToolCallView] = Field(default_factory=list)
    truncated: bool = False
    """The text is the message's tail: the whole message was longer."""


class InFlightCall(BaseModel):
    """A model call the proxy has sent upstream and not yet answered."""

    call_id: int
    started_at: float
    dialect: str | None = None
    path: str | None = None
    messages: int = 0
    """How many messages the call's prompt holds."""
    engine_updating_since: float | None = None
    """Since when the engine has refused this call with a 503 (updating its weights), the proxy
    resending it; None while the engine works on it (or holds it, paused in keep mode)."""


class SessionActivity(BaseModel):
    """The session's calls in flight and its last exchange with the engine."""

    session_id: str
    now: float
    """The server's clock when this was built (ages are `now - started_at`)."""
    in_flight: list[InFlightCall] = Field(default_factory=list)
    calls_started: int = 0
    calls_ended: int = 0
    errors: int = 0
    last_assistant: MessageView | None = None
    """The newest assistant message: the last reply, else the last one the agent sent back."""
    last_tool_call: ToolCallView | None = None
    last_observation: MessageView | None = None
    """The newest tool result or user message the agent sent (what the model was shown last)."""
    last_finish_reason: str | None = None
    last_error: str | None = None
    last_ended_at: float | None = None
    recent_ends: list[float] = Field(default_factory=list)
    """When the last calls ended (oldest first, a bounded window): calls per second over time."""
