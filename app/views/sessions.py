"""The Sessions screen's table: a person's word for where a session or rollout is, the live board of
session summaries it is drawn from, and the least change that brings the table up to date."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from tapdeck.app.views.text import clip, fmt_reward, short_id
from tapdeck.schema.runs import ENDED_PHASES, RolloutResult
from tapdeck.schema.sessions import SessionSummary

# A running session with no model call for this long is highlighted (an agent that looks stuck).
IDLE_AFTER_S = 60.0

SESSION_COLUMNS: tuple[tuple[str, str, int], ...] = (  # key, header, width (fits 80 columns)
    ("session", "session", 8),
    ("task", "task", 10),
    ("state", "state", 15),
    ("turns", "turn", 4),
    ("roots", "root", 4),
    ("forks", "fork", 4),
    ("tokens", "tokens", 6),
    ("idle", "idle", 5),
    ("reward", "reward", 6),
)

WIDE_COLUMNS: tuple[tuple[str, str, int], ...] = (  # shown from WIDE_AT columns on
    ("harness", "harness", 12),
    ("run", "run", 24),
    ("elapsed", "elapsed", 7),
    ("rate", "calls/min", 9),
    ("finish", "last finish", 11),
)
WIDE_AT = 120
"""Terminal width from which the session table shows WIDE_COLUMNS too."""
NARROW_BELOW = 80
NARROW_HIDDEN = ("roots", "forks", "tokens")
"""Below NARROW_BELOW columns the table drops these (the graph counts, also on Rollout) so that
state, idle and reward stay on screen; the summary line says they are hidden."""
SERVER_COLUMN = ("server", "server", 10)
"""First, with the TUI attached to several servers (app/server_links.py adds its cell)."""
SERVER_HIDDEN = ("roots", "forks")
"""With the server column, under WIDE_AT the table drops these too, so that it still fits 80."""

CALL_TIMES_KEPT = 20_000
"""Captured calls remembered for the board's calls/s line (far more than two minutes hold)."""

Cell = tuple[str, str]  # (text, tone); the widget maps tones to theme colours
T = TypeVar("T")


def session_state(summary: SessionSummary) -> str:
    """A person's word for where a session is, from the runner's `phase` metadata and its turns."""
    phase = summary.metadata.get("phase")
    ended = phase == "done" or summary.state == "closed"
    state = _state(
        phase,
        ended=ended,
        fatal=summary.fatal > 0,
        turns=summary.turns,
        cancelled=summary.metadata.get("error_kind") == "cancelled",
    )
    # Its server stopped before it ended: it will never call again, so never a live word.
    if summary.state == "interrupted" and state not in ENDED_STATES:
        return "interrupted"
    # A call the engine refuses while it syncs weights is being resent: a wait, not a stuck agent.
    return "engine updating" if summary.calls_awaiting_engine and state not in ENDED_STATES else state


def rollout_state(rollout: RolloutResult) -> str:
    """The same word for a rollout that has no capture session (its phase is all there is)."""
    ended = rollout.phase in ENDED_PHASES
    phase = "failed" if rollout.phase == "done" and not rollout.ok else rollout.phase
    return _state(
        phase, ended=ended, fatal=False, turns=rollout.turns, cancelled=rollout.error_kind == "cancelled"
    )


def _state(phase: Any, *, ended: bool, fatal: bool, turns: int, cancelled: bool) -> str:
    # Cancelled is a person's choice, not a failure: the same word Runs' error column uses.
    if cancelled and (ended or phase == "failed"):
        return "cancelled"
    if phase == "failed" or (ended and fatal):
        return "failed"
    if ended:
        return "finished"
    if phase == "queued":
        return "queued"
    if phase in ("install", "sandbox", "agent_setup"):
        return "booting"
    if phase == "verify":
        return "verifying"
    return "running" if turns else "no call yet"


ENDED_STATES = ("finished", "failed", "cancelled", "interrupted")
"""The states of a rollout that is over (nothing left to cancel)."""

STATE_TONES = {
    "failed": "error",
    "finished": "success",
    "cancelled": "warning",
    "running": "accent",
    "verifying": "accent",
    "booting": "muted",
    "no call yet": "warning",
    "queued": "muted",
    "interrupted": "warning",
    "engine updating": "warning",
}


def fmt_phase(rollout: RolloutResult, *, run_going: bool = True) -> str:
    """A rollout's phase, with its progress line while it has one (an agent CLI installing); a
    cancelled rollout's is "cancelled", not the "failed" the runner records it under, and one still
    queued when its run stopped is "not run" (a resume runs it)."""
    if rollout_state(rollout) == "cancelled":
        return "cancelled"
    if rollout.phase == "queued" and not run_going:
        return "not run"
    return f"{rollout.phase}: {rollout.detail[:40]}" if rollout.detail else rollout.phase


@dataclass
class _Entry:
    summary: SessionSummary
    received: float  # local monotonic time the summary arrived


@dataclass
class SessionBoard:
    """Live session summaries keyed by id; `version` grows on every change (screens poll it).

    Rollouts that have no capture session (harnesses that never call a model: oracle, nop) are kept
    too, keyed by rollout id, so every rollout of a batch shows up and reaches its end state.
    """

    entries: dict[str, _Entry] = field(default_factory=dict)
    rollouts: dict[str, RolloutResult] = field(default_factory=dict)
    finish_reasons: dict[str, str] = field(default_factory=dict)
    """Each session's last captured finish reason (from `turn_captured` events)."""
    call_times: deque[float] = field(default_factory=lambda: deque(maxlen=CALL_TIMES_KEPT))
    """When each `turn_captured` event reached this client (its clock), newest last: calls/s."""
    version: int = 0
    _settled: dict[tuple[str, str], tuple[_Entry, Any]] = field(default_factory=dict, repr=False)
    """What `settled` built from an ended session's summary, by (session id, what)."""
    _made: dict[str, tuple[_Entry, tuple, tuple[Cell, ...]]] = field(default_factory=dict, repr=False)
    """Each session's row as `_row` last made it: from which summary, with which moving values."""

    def settled(self, session_id: str, what: str, build: Callable[[], T]) -> T:
        """`build()` of a session's row (`what` names which), built again for an open session
        each time, but once per summary for one that ended: its row no longer moves with the
        clock, and at 1,000 sessions most rows are such (the table is refreshed 4 times a second)."""
        entry = self.entries[session_id]
        if entry.summary.state == "open":
            return build()
        kept = self._settled.get((session_id, what))
        if kept is None or kept[0] is not entry:
            kept = self._settled[(session_id, what)] = (entry, build())
        return kept[1]

    def note_call(self, now: float) -> None:
        """One model call captured by any session, seen at `now`."""
        self.call_times.append(now)
        self.version += 1

    def upsert_rollout(self, rollout: RolloutResult) -> None:
        """Take one RolloutResult (from a `rollout_updated` event or a run's detail)."""
        self.rollouts[rollout.rollout_id] = rollout
        self.version += 1

    def replace_rollouts(self, running: Iterable[RolloutResult]) -> None:
        """Resynchronise rollouts: `running` (the rollouts of the runs going now) replace every
        rollout that had not ended; ended ones stay (an oracle's result row)."""
        self.rollouts = {rid: r for rid, r in self.rollouts.items() if r.phase in ENDED_PHASES}
        for rollout in running:
            self.rollouts[rollout.rollout_id] = rollout
        self.version += 1

    def run_ended(self, run_id: str) -> None:
        """A run ended: its rollouts that had not ended (queued ones never started) leave the board."""
        self.rollouts = {
            rid: r for rid, r in self.rollouts.items() if r.run_id != run_id or r.phase in ENDED_PHASES
        }
        self.version += 1

    def sessionless(self) -> dict[str, RolloutResult]:
        """Rollouts whose capture session is unknown here (none opened, or not listed)."""
        # A session names its rollout in its metadata from the moment it opens, while the
        # rollout's own session id comes later from the runs side: match on either.
        listed = {e.summary.metadata.get("rollout_id") for e in self.entries.values()}
        return {
            rid: r
            for rid, r in self.rollouts.items()
            if rid not in listed and not (r.session_id and r.session_id in self.entries)
        }

    def rollout_of(self, key: str | None) -> RolloutResult | None:
        """The rollout of a table row: by session id (the rule `sessionless` matches by), or the
        row is a sessionless rollout."""
        if key in self.rollouts:
            return self.rollouts[key]
        entry = self.entries.get(key) if key else None
        named = entry.summary.metadata.get("rollout_id") if entry is not None else None
        if named in self.rollouts:
            return self.rollouts[named]
        return next((r for r in self.rollouts.values() if key and r.session_id == key), None)

    def replace_all(self, summaries: Iterable[SessionSummary], now: float) -> None:
        """Resynchronise from `GET /admin/sessions` (start-up or after the event stream reconnects)."""
        self.entries = {s.id: _Entry(s, now) for s in summaries}
        self._settled, self._made = {}, {}
        self.version += 1

    def upsert(self, summary: SessionSummary, now: float) -> None:
        """Take one SessionSummary from an event."""
        self.entries[summary.id] = _Entry(summary, now)
        self.version += 1

    def get(self, session_id: str) -> SessionSummary | None:
        entry = self.entries.get(session_id)
        return entry.summary if entry else None

    def idle_seconds(self, session_id: str, now: float) -> float | None:
        """Seconds since the session's last model call, advanced locally (no clock-skew trouble)."""
        entry = self.entries[session_id]
        base = entry.summary.seconds_since_last_call
        if base is None:
            return None
        return base + max(0.0, now - entry.received)

    def calling_seconds(self, session_id: str, now: float) -> float | None:
        """How long the session's oldest unanswered model call has waited, advanced locally; None
        while no call is in flight."""
        entry = self.entries[session_id]
        base = entry.summary.seconds_calling
        if base is None:
            return None
        return base + max(0.0, now - entry.received)

    def rows(self, now: float) -> dict[str, tuple[Cell, ...]]:
        """One row of cells per session (and per sessionless rollout), oldest first."""
        keyed: list[tuple[float, str, tuple[Cell, ...]]] = [
            (entry.summary.created_at, sid, self.settled(sid, "row", partial(self._row, sid, entry, now)))
            for sid, entry in self.entries.items()
        ]
        keyed += [(r.started_at or 0, rid, self._rollout_row(r)) for rid, r in self.sessionless().items()]
        return {key: row for _, key, row in sorted(keyed, key=lambda item: (item[0], item[1]))}

    def states(self) -> list[str]:
        """The state of every row (for the summary line)."""
        return [session_state(e.summary) for e in self.entries.values()] + [
            rollout_state(r) for r in self.sessionless().values()
        ]

    def _rollout_row(self, rollout: RolloutResult) -> tuple[Cell, ...]:
        state = rollout_state(rollout)
        return (
            ("(none)", "muted"),
            (clip(rollout.task, 10) or "–", ""),
            (state, STATE_TONES.get(state, "")),
            (str(rollout.turns), ""),
            ("–", ""),
            ("–", ""),
            ("–", ""),
            ("–", ""),
            (fmt_reward(rollout.reward), ""),
            (clip(rollout.harness or "–", 12), ""),
            (rollout.run_id or "–", ""),
            ("–", ""),
            ("–", ""),
            ("–", ""),
        )

    def _row(self, sid: str, entry: _Entry, now: float) -> tuple[Cell, ...]:
        """The row of a session; the one made last time (the same object) while neither its
        summary nor what moves with the clock (its counters' whole seconds, its calls/min) changed."""
        s = entry.summary
        state = session_state(s)
        live = state in ("running", "no call yet")
        idle = self.idle_seconds(sid, now) if live else None
        calling = self.calling_seconds(sid, now) if live else None
        elapsed = session_elapsed(s, max(0.0, now - entry.received))
        moving = (
            None if idle is None else int(idle),
            "idle" if idle is not None and idle >= IDLE_AFTER_S else "",
            None if calling is None else int(calling),
            None if elapsed is None else int(elapsed),
            f"{s.turns / (elapsed / 60):.1f}" if elapsed and s.turns else "–",
            self.finish_reasons.get(sid),
        )
        made = self._made.get(sid)
        if made is not None and made[0] is entry and made[1] == moving:
            return made[2]
        idle_s, idle_tone, calling_s, elapsed_s, rate, finish = moving
        task = s.metadata.get("task") or ""
        row = (
            (short_id(sid), ""),
            (clip(str(task), 10) or "–", ""),
            (state, STATE_TONES.get(state, "")) if calling_s is None else (f"calling {calling_s}s", "accent"),
            (str(s.turns), ""),
            (str(s.roots), ""),
            (str(s.forks), ""),
            (str(s.trainable_tokens), ""),
            ("–" if idle_s is None else f"{idle_s}", idle_tone),
            (fmt_reward(s.metadata.get("reward")), ""),
            # The wide table's: harness, run, elapsed, calls/min, last finish reason.
            (clip(str(s.metadata.get("harness") or "–"), 12), ""),
            (str(s.metadata.get("run_id") or "–"), ""),
            ("–" if elapsed_s is None else f"{elapsed_s}", ""),
            (rate, ""),
            (finish or "–", "warning" if finish == "length" else ""),
        )
        self._made[sid] = (entry, moving, row)
        return row


def session_elapsed(summary: SessionSummary, since_received: float) -> float | None:
    """Seconds from a session's start to its last call (closed) or to now (open), on the server's
    clock: its `last_call_at` plus `seconds_since_last_call` is the server's time when it was sent."""
    if summary.last_call_at is None:
        return None
    if summary.state != "open":
        return max(0.0, summary.last_call_at - summary.created_at)
    since = summary.seconds_since_last_call or 0.0
    return max(0.0, summary.last_call_at + since + since_received - summary.created_at)


@dataclass
class RowDiff:
    """What to change in a keyed table to go from one set of rows to the next."""

    removed: list[str]
    added: list[tuple[str, tuple]]
    changed: list[tuple[str, int, Any]]


def diff_rows(old: Mapping[str, tuple], new: Mapping[str, tuple]) -> RowDiff:
    """Rows to remove, rows to add, and (key, column, value) for each changed cell only."""
    removed = [key for key in old if key not in new]
    added: list[tuple[str, tuple]] = []
    changed: list[tuple[str, int, Any]] = []
    for key, row in new.items():
        before = old.get(key)
        if before is None:
            added.append((key, row))
            continue
        if before is row:  # the same row object (one that ended): nothing in it changed
            continue
        changed.extend(
            (key, i, cell) for i, (cell, prev) in enumerate(zip(row, before, strict=False)) if cell != prev
        )
    return RowDiff(removed, added, changed)
