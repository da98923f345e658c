"""Filter and sort for the Sessions and Runs tables: which rows a typed filter keeps, the order a
sort key (or "stuck first") puts them in, and the line that says what is in force. Free of Textual.

A filter is words, each of which a row must match (case-insensitive, anywhere in the value): a
bare word matches any of task, session id, run, state, harness and server; `state:word` (or
`task:`, `session:`, `run:`, `harness:`, `server:`) only that field. The server is the short name
of the server a row came from, with the TUI attached to several (app/server_links.py); "" with one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from tapdeck.app.views.sessions import SessionBoard, rollout_state, session_state
from tapdeck.schema.runs import RolloutResult

FILTER_FIELDS = ("task", "session", "run", "state", "harness", "server")
SORT_KEYS = ("idle", "calls", "tokens", "reward", "state", "start")
"""The order the sort key cycles through."""
STUCK = "stuck"
"""The sort that puts live rows first: those waiting on a model call, the longest waiting first,
then the others, the longest since a model call ended first."""

_DESCENDING = {"idle", "calls", "tokens", "reward"}
"""Keys whose first order is largest first (what an operator looks for); state and start go up."""
_LIVE = ("running", "no call yet")
"""The states whose idle time counts (an agent between, or inside, its model calls)."""


@dataclass(frozen=True)
class RowFacts:
    """What a filter and a sort read of one row. `idle`: seconds since the last model call ended,
    for a live row only (an unanswered call keeps it growing); None where nothing is known.
    `calling`: seconds its oldest unanswered model call has waited, for a live row; None while it
    has none in flight."""

    key: str
    task: str = ""
    session: str = ""
    run: str = ""
    state: str = ""
    harness: str = ""
    server: str = ""
    idle: float | None = None
    calling: float | None = None
    calls: int = 0
    tokens: int | None = None
    reward: float | None = None
    start: float | None = None

    def field(self, name: str) -> str:
        return str(getattr(self, name))


@dataclass(frozen=True)
class RowView:
    """A screen's filter and sort. `sort`: one of SORT_KEYS, STUCK, or None (the table's own
    order); `reverse` flips the key's first order."""

    filter: str = ""
    sort: str | None = None
    reverse: bool = False

    @property
    def arranges(self) -> bool:
        """Whether `arrange` can drop or move a row under this view (else it keeps them all, in
        the order given, and no row's facts need be read)."""
        return bool(filter_terms(self.filter)) or self.sort is not None

    def next_sort(self) -> RowView:
        """The next key of SORT_KEYS (after the last, the table's own order), first order."""
        at = SORT_KEYS.index(self.sort) + 1 if self.sort in SORT_KEYS else 0
        return RowView(self.filter, SORT_KEYS[at] if at < len(SORT_KEYS) else None)

    def flipped(self) -> RowView:
        """The same sort the other way (a first press with none in force sorts by SORT_KEYS[0])."""
        if self.sort is None:
            return RowView(self.filter, SORT_KEYS[0], reverse=True)
        return RowView(self.filter, self.sort, not self.reverse)

    def stuck_first(self) -> RowView:
        """Stuck first on, or off again when it is on."""
        return RowView(self.filter, None if self.sort == STUCK else STUCK)

    def filtered(self, text: str) -> RowView:
        return RowView(text, self.sort, self.reverse)

    def to_json(self) -> dict[str, Any]:
        return {"filter": self.filter, "sort": self.sort, "reverse": self.reverse}

    @classmethod
    def from_json(cls, raw: Any) -> RowView:
        """From the settings file; anything unknown there is dropped, never an error."""
        if not isinstance(raw, Mapping):
            return cls()
        text, sort = raw.get("filter"), raw.get("sort")
        return cls(
            text if isinstance(text, str) else "",
            sort if sort in (*SORT_KEYS, STUCK) else None,
            raw.get("reverse") is True and sort in SORT_KEYS,
        )


def filter_terms(text: str) -> list[tuple[str | None, str]]:
    """(field or None for any, lower-cased word) per word of `text`; a prefix naming no field is
    part of the word."""
    terms: list[tuple[str | None, str]] = []
    for word in text.lower().split():
        name, colon, value = word.partition(":")
        if colon and name in FILTER_FIELDS:
            if value:
                terms.append((name, value))
        else:
            terms.append((None, word))
    return terms


def matches(row: RowFacts, terms: Iterable[tuple[str | None, str]]) -> bool:
    """Whether `row` matches every term."""
    for name, word in terms:
        fields = FILTER_FIELDS if name is None else (name,)
        if not any(word in row.field(f).lower() for f in fields):
            return False
    return True


def _sort_value(row: RowFacts, key: str) -> Any:
    return row.state if key == "state" else getattr(row, key)


def arrange(rows: Iterable[RowFacts], view: RowView) -> list[str]:
    """The keys of the rows `view` keeps, in its order; rows equal under the sort (and every row
    when none is in force) keep the order given. Rows with no value for the key go last, either
    way round."""
    terms = filter_terms(view.filter)
    kept = [row for row in rows if matches(row, terms)]
    if view.sort == STUCK:
        live = [row for row in kept if row.state in _LIVE and (row.idle, row.calling) != (None, None)]
        live.sort(
            key=lambda row: (row.calling is not None, row.calling or 0.0, row.idle or 0.0), reverse=True
        )
        first = {row.key for row in live}
        return [row.key for row in live] + [row.key for row in kept if row.key not in first]
    if view.sort not in SORT_KEYS:
        return [row.key for row in kept]
    key = view.sort
    known = [row for row in kept if _sort_value(row, key) is not None]
    unknown = [row for row in kept if _sort_value(row, key) is None]
    known.sort(key=lambda row: _sort_value(row, key), reverse=(key in _DESCENDING) != view.reverse)
    return [row.key for row in known + unknown]


def view_line(view: RowView, shown: int, total: int) -> str:
    """`/ state:run (3 of 8) · sort idle ↓`: the filter and sort in force; "" when neither is."""
    parts = []
    if view.filter.strip():
        parts.append(f"/ {view.filter.strip()} ({shown} of {total})")
    if view.sort == STUCK:
        parts.append("stuck first")
    elif view.sort in SORT_KEYS:
        down = (view.sort in _DESCENDING) != view.reverse
        parts.append(f"sort {view.sort} {'↓' if down else '↑'}")
    return " · ".join(parts)


def board_facts(
    board: SessionBoard, now: float, *, server: str = "", prefix: str = ""
) -> dict[str, RowFacts]:
    """The facts of the Sessions table's rows, by `SessionBoard.rows`' keys after `prefix` (the
    table's keys with several servers); `server`: the name of the server the board is of."""
    what = f"facts {prefix}"
    facts = [
        board.settled(sid, what, partial(_session_facts, board, sid, now, server, prefix))
        for sid in board.entries
    ]
    for rid, rollout in board.sessionless().items():
        facts.append(rollout_facts(rollout, None, key=prefix + rid, server=server))
    return {row.key: row for row in facts}


def _session_facts(board: SessionBoard, sid: str, now: float, server: str, prefix: str) -> RowFacts:
    s = board.entries[sid].summary
    state = session_state(s)
    reward = s.metadata.get("reward")
    return RowFacts(
        key=prefix + sid,
        task=str(s.metadata.get("task") or ""),
        session=sid,
        run=str(s.metadata.get("run_id") or ""),
        state=state,
        harness=str(s.metadata.get("harness") or ""),
        server=server,
        idle=board.idle_seconds(sid, now) if state in _LIVE else None,
        calling=board.calling_seconds(sid, now) if state in _LIVE else None,
        calls=s.turns,
        tokens=s.trainable_tokens,
        reward=float(reward) if isinstance(reward, int | float) and not isinstance(reward, bool) else None,
        start=s.created_at,
    )


def rollout_facts(
    rollout: RolloutResult,
    board: SessionBoard | None,
    *,
    key: str | None = None,
    now: float = 0.0,
    server: str = "",
) -> RowFacts:
    """The facts of one rollout (a Runs row, or a Sessions row without a session): its capture
    session's live counts from `board` when it has one there; `server`: the name of the server it
    ran on, with the TUI attached to several."""
    entry = board.entries.get(rollout.session_id) if board and rollout.session_id else None
    summary = entry.summary if entry is not None else None
    state = session_state(summary) if summary is not None else rollout_state(rollout)
    return RowFacts(
        key=key or rollout.rollout_id,
        task=rollout.task,
        session=rollout.session_id or "",
        run=rollout.run_id or "",
        state=state,
        harness=rollout.harness or "",
        server=server,
        idle=board.idle_seconds(summary.id, now) if board and summary and state in _LIVE else None,
        calling=board.calling_seconds(summary.id, now) if board and summary and state in _LIVE else None,
        calls=max(rollout.turns, summary.turns) if summary is not None else rollout.turns,
        tokens=summary.trainable_tokens if summary is not None else None,
        reward=rollout.reward,
        start=rollout.started_at,
    )
