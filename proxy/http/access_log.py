"""One access-log line per model call, refused calls included.

An operator debugging an agent needs to see every call it made, with the status the agent got:
`call 200 anthropic /v1/messages session=3f9c2a1b turn=4 finish=stop stream 812ms`. Keys never
appear: the session is named by the first characters of its id (not its key), and the path is
logged without its query (Google clients may send `?key=`).
"""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

log = logging.getLogger("tapdeck.access")

SESSION_ID_CHARS = 8


@dataclass
class AccessRecord:
    """What one call's line says; filled in as the call goes through the pipeline."""

    path: str
    dialect: str = "-"
    session_id: str | None = None
    status: int | None = None
    stream: bool = False
    seq: int | None = None
    finish: str | None = None
    error: str | None = None
    """The error kind of a refused or failed call (`authentication_error`, `unreachable`, ...)."""
    started: float = field(default_factory=time.perf_counter)
    done: bool = False

    def line(self) -> str:
        """The log line (no key, no query string)."""
        ms = (time.perf_counter() - self.started) * 1000
        parts = [
            f"call {self.status if self.status is not None else '-'}",
            self.dialect,
            self.path.split("?", 1)[0],
            f"session={self.session_id[:SESSION_ID_CHARS] if self.session_id else '-'}",
            f"turn={self.seq if self.seq is not None else '-'}",
            f"finish={self.finish or '-'}",
        ]
        if self.error:
            parts.append(f"error={self.error}")
        parts.append("stream" if self.stream else "json")
        parts.append(f"{ms:.0f}ms")
        return " ".join(parts)

    def emit(self) -> None:
        """Log the line once (a stream's line is written when the stream ends)."""
        if self.done:
            return
        self.done = True
        level = logging.WARNING if self.status is not None and self.status >= 500 else logging.INFO
        if not log.isEnabledFor(level):
            return
        # The record is made here rather than by `log.log`, which walks the stack to find its
        # caller (always this method): that was a sixth of the line's CPU, on every model call.
        log.handle(log.makeRecord(log.name, level, __file__, 0, "%s", (self.line(),), None, func="emit"))


CURRENT_CALL: ContextVar[AccessRecord | None] = ContextVar("tapdeck_current_call", default=None)
"""The record of the call being handled; the turn's seq is written into it where the turn is
committed (tasks started for the call inherit it)."""

__all__ = ["CURRENT_CALL", "AccessRecord", "log"]
