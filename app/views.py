"""What the screens show, computed from the server's replies — free of Textual so it is testable alone.

Each function takes the `tapdeck.schema` models the client validated the replies into and returns
plain values; the widgets only style them. Values the server left empty show as "–".
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.cells import cell_len

from tapdeck.app.client import ApiError
from tapdeck.runner.harnesses import calls_a_model
from tapdeck.schema.findings import Finding, Level
from tapdeck.schema.runs import (
    ENDED_PHASES,
    NO_ENGINE,
    RolloutResult,
    RunSummary,
    mean_reward,
    pass_rate,
)
from tapdeck.schema.sessions import GraphTurn, GraphView, RolloutStats, SessionSummary, TurnDetail
from tapdeck.schema.settings import ResolvedSettings

# A running session with no model call for this long is highlighted (an agent that looks stuck).
IDLE_AFTER_S = 60.0

SESSION_COLUMNS: tuple[tuple[str, str, int], ...] = (  # key, header, width (fits 80 columns)
    ("session", "session", 8), ("task", "task", 12), ("state", "state", 11), ("turns", "turn", 4),
    ("roots", "root", 4), ("forks", "fork", 4), ("tokens", "tokens", 6), ("idle", "idle", 5),
    ("reward", "reward", 6),
)

WIDE_COLUMNS: tuple[tuple[str, str, int], ...] = (  # shown from WIDE_AT columns on
    ("harness", "harness", 12), ("run", "run", 24), ("elapsed", "elapsed", 7),
    ("rate", "calls/min", 9), ("finish", "last finish", 11),
)
WIDE_AT = 120
"""Terminal width from which the session table shows WIDE_COLUMNS too."""
NARROW_BELOW = 80
NARROW_HIDDEN = ("roots", "forks", "tokens")
"""Below NARROW_BELOW columns the table drops these (the graph counts, also on Rollout) so that
state, idle and reward stay on screen; the summary line says they are hidden."""

CALL_TIMES_KEPT = 20_000
"""Captured calls remembered for the board's calls/s line (far more than two minutes hold)."""

Cell = tuple[str, str]  # (text, tone); the widget maps tones to theme colours


def session_state(summary: SessionSummary) -> str:
    """A person's word for where a session is, from the runner's `phase` metadata and its turns."""
    phase = summary.metadata.get("phase")
    ended = phase == "done" or summary.state == "closed"
    state = _state(phase, ended=ended, fatal=summary.fatal > 0, turns=summary.turns,
                   cancelled=summary.metadata.get("error_kind") == "cancelled")
    # Its server stopped before it ended: it will never call again, so never a live word.
    return "interrupted" if summary.state == "interrupted" and state not in ENDED_STATES else state


def rollout_state(rollout: RolloutResult) -> str:
    """The same word for a rollout that has no capture session (its phase is all there is)."""
    ended = rollout.phase in ENDED_PHASES
    phase = "failed" if rollout.phase == "done" and not rollout.ok else rollout.phase
    return _state(phase, ended=ended, fatal=False, turns=rollout.turns,
                  cancelled=rollout.error_kind == "cancelled")


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

STATE_TONES = {"failed": "error", "finished": "success", "cancelled": "warning", "running": "accent",
               "verifying": "accent", "booting": "muted", "no call yet": "warning", "queued": "muted",
               "interrupted": "warning"}


def fmt_phase(rollout: RolloutResult, *, run_going: bool = True) -> str:
    """A rollout's phase, with its progress line while it has one (an agent CLI installing); a
    cancelled rollout's is "cancelled", not the "failed" the runner records it under, and one still
    queued when its run stopped is "not run" (a resume runs it)."""
    if rollout_state(rollout) == "cancelled":
        return "cancelled"
    if rollout.phase == "queued" and not run_going:
        return "not run"
    return f"{rollout.phase}: {rollout.detail[:40]}" if rollout.detail else rollout.phase


def fmt_reward(value: Any) -> str:
    """`reward: null` means never graded: show "–", never 0."""
    if value is None or isinstance(value, bool):
        return "–"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "–"
    return f"{number:.2f}" if math.isfinite(number) else "–"


def short_id(value: str | None, width: int = 8) -> str:
    """The first characters of an id (enough to tell sessions apart on screen)."""
    return (value or "–")[:width]


def clip(value: str, width: int) -> str:
    """`value` when it fits in `width`, else its start and an ellipsis: a cut name says it is cut."""
    return value if len(value) <= width else value[:width - 1] + "…"


def id_tail(value: str, width: int) -> str:
    """The whole id when it fits in `width`, else its end: ids that share a prefix (run ids start
    with their date) differ at the end."""
    return value if len(value) <= width else "…" + value[len(value) - width + 1:]


PHRASE_SEP = " · "
"""Between the phrases of a header line; a line it breaks starts with its dot (`phrase_lines`)."""


def phrase_lines(phrases: Iterable[str], width: int) -> list[str]:
    """Phrases such as "turns 3" or "prefix link to #2" joined by " · " into lines of at most
    `width` cells, broken only between phrases (a continued line starts with "· "), so that no
    phrase is split. A phrase wider than a line is split anyway: it follows on the line it
    reaches, for the widget to wrap at its spaces, rather than leave that line's end empty."""
    lead = PHRASE_SEP.lstrip()
    lines: list[str] = []
    for phrase in filter(None, phrases):
        if not lines:
            lines.append(phrase)
        elif (cell_len(lines[-1] + PHRASE_SEP + phrase) <= width
              or cell_len(lead + phrase) > width):
            lines[-1] += PHRASE_SEP + phrase
        else:
            lines.append(lead + phrase)
    return lines


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
        self.rollouts = {rid: r for rid, r in self.rollouts.items()
                         if r.run_id != run_id or r.phase in ENDED_PHASES}
        self.version += 1

    def sessionless(self) -> dict[str, RolloutResult]:
        """Rollouts whose capture session is unknown here (none opened, or not listed)."""
        # A session names its rollout in its metadata from the moment it opens, while the
        # rollout's own session id comes later from the runs side: match on either.
        listed = {e.summary.metadata.get("rollout_id") for e in self.entries.values()}
        return {rid: r for rid, r in self.rollouts.items()
                if rid not in listed and not (r.session_id and r.session_id in self.entries)}

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

    def rows(self, now: float) -> dict[str, tuple[Cell, ...]]:
        """One row of cells per session (and per sessionless rollout), oldest first."""
        keyed: list[tuple[float, str, tuple[Cell, ...]]] = [
            (entry.summary.created_at, sid, self._row(sid, entry, now))
            for sid, entry in self.entries.items()]
        keyed += [(r.started_at or 0, rid, self._rollout_row(r))
                  for rid, r in self.sessionless().items()]
        return {key: row for _, key, row in sorted(keyed, key=lambda item: (item[0], item[1]))}

    def states(self) -> list[str]:
        """The state of every row (for the summary line)."""
        return ([session_state(e.summary) for e in self.entries.values()]
                + [rollout_state(r) for r in self.sessionless().values()])

    def _rollout_row(self, rollout: RolloutResult) -> tuple[Cell, ...]:
        state = rollout_state(rollout)
        return (
            ("(none)", "muted"),
            (clip(rollout.task, 12) or "–", ""),
            (state, STATE_TONES.get(state, "")),
            (str(rollout.turns), ""), ("–", ""), ("–", ""), ("–", ""), ("–", ""),
            (fmt_reward(rollout.reward), ""),
            (clip(rollout.harness or "–", 12), ""), (rollout.run_id or "–", ""), ("–", ""), ("–", ""),
            ("–", ""),
        )

    def _row(self, sid: str, entry: _Entry, now: float) -> tuple[Cell, ...]:
        s = entry.summary
        state = session_state(s)
        idle = self.idle_seconds(sid, now)
        live = state in ("running", "no call yet")
        idle_tone = "idle" if live and idle is not None and idle >= IDLE_AFTER_S else ""
        task = s.metadata.get("task") or ""
        return (
            (short_id(sid), ""),
            (clip(str(task), 12) or "–", ""),
            (state, STATE_TONES.get(state, "")),
            (str(s.turns), ""),
            (str(s.roots), ""),
            (str(s.forks), ""),
            (str(s.trainable_tokens), ""),
            ("–" if idle is None or not live else f"{int(idle)}", idle_tone),
            (fmt_reward(s.metadata.get("reward")), ""),
            *self._wide(sid, entry, now),
        )

    def _wide(self, sid: str, entry: _Entry, now: float) -> tuple[Cell, ...]:
        """harness, run, elapsed, calls/min, last finish reason (the wide table's columns)."""
        s = entry.summary
        elapsed = session_elapsed(s, max(0.0, now - entry.received))
        rate = f"{s.turns / (elapsed / 60):.1f}" if elapsed and s.turns else "–"
        finish = self.finish_reasons.get(sid)
        return ((clip(str(s.metadata.get("harness") or "–"), 12), ""), (str(s.metadata.get("run_id") or "–"), ""),
                ("–" if elapsed is None else f"{int(elapsed)}", ""), (rate, ""),
                (finish or "–", "warning" if finish == "length" else ""))


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
        changed.extend((key, i, cell) for i, (cell, prev) in enumerate(zip(row, before, strict=False))
                       if cell != prev)
    return RowDiff(removed, added, changed)


# -- rollout graph ------------------------------------------------------------------------------

@dataclass
class TurnNode:
    """One node of the rollout tree as the Rollout screen shows it."""

    seq: int
    parent: int | None
    kind: str  # root | prefix | retokenized | message
    role: str  # agent | auxiliary | discarded
    discarded: bool
    finish_reason: str | None
    new_tokens: int | None
    findings: list[Finding]
    children: list[int] = field(default_factory=list)
    mode: str | None = None
    """Token-in sessions: `ids` (continued from stored ids) or `text` (fell back); else None."""


def worst_level(findings: Iterable[Finding]) -> Level | None:
    """The most severe level among `findings` (None when there are none)."""
    levels = {f.level for f in findings}
    return next((level for level in (Level.FATAL, Level.WARN, Level.INFO) if level in levels), None)


@dataclass
class LiveGraph:
    """The Rollout screen's copy of one session's graph, kept current from `GraphView` replies:
    each reply adds the turns it carries and moves older ones (adoption, discards)."""

    turns: dict[int, GraphTurn] = field(default_factory=dict)
    stats: RolloutStats | None = None
    findings: list[Finding] = field(default_factory=list)
    tier: str = ""
    missing: set[int] = field(default_factory=set)
    """Turns a reply listed in `links` whose header this copy has not received."""

    def next_since(self) -> int:
        """The `since` to ask for: the first turn this copy lacks."""
        if self.missing:
            return min(self.missing)
        return max(self.turns) + 1 if self.turns else 0

    def apply(self, view: GraphView) -> bool:
        """Take one reply; whether the tree changed (new turns, a new parent or role)."""
        changed = bool(view.turns)
        for turn in view.turns:
            self.turns[turn.seq] = turn
        self.missing = set()
        for seq, parent, role in view.links:
            turn = self.turns.get(seq)
            if turn is None:
                self.missing.add(seq)
            elif (turn.parent, turn.role) != (parent, role):
                self.turns[seq] = turn.model_copy(update={"parent": parent, "role": role})
                changed = True
        self.stats, self.findings, self.tier = view.stats, view.findings, str(view.tier)
        return changed


def rollout_nodes(turns: Iterable[GraphTurn]) -> dict[int, TurnNode]:
    """The tree's nodes from turn headers, keyed by seq, with children lists filled in."""
    nodes = {turn.seq: TurnNode(seq=turn.seq, parent=turn.parent, kind=turn.link_kind,
                                role=turn.role, discarded=turn.role == "discarded",
                                finish_reason=turn.finish_reason, new_tokens=turn.sampled_len,
                                findings=list(turn.findings), mode=turn.token_in)
             for turn in turns}
    for node in nodes.values():
        if node.parent is not None and node.parent in nodes:
            nodes[node.parent].children.append(node.seq)
    for node in nodes.values():
        node.children.sort()
    return nodes


def capture_mode_text(meta: Mapping[str, Any]) -> str:
    """The Rollout screen's words for a turn's capture mode ("" outside token-in mode)."""
    record = meta.get("capture_mode") or {}
    if record.get("mode") == "ids":
        same = "same ids as text" if record.get("same") else \
            f"text path would differ from offset {record.get('diverge_at')}"
        return f"token-in from #{record.get('extends')} ({same})"
    if record.get("mode") == "text":
        return f"text (fell back: {record.get('reason', '?')})"
    return ""


def rollout_roots(nodes: Mapping[int, TurnNode]) -> list[int]:
    """Seqs with no (known) parent, in arrival order."""
    return sorted(seq for seq, n in nodes.items() if n.parent is None or n.parent not in nodes)


def display_parents(nodes: Mapping[int, TurnNode]) -> dict[int, int | None]:
    """Where each turn is listed in the tree (None: at the top).

    A chain of single continuations is listed flat under its head (a root, or one child of a
    fork) rather than one level deeper per turn, which at 80 columns would push a 40-turn
    rollout's labels off the screen; only forks nest.
    """
    roots = set(rollout_roots(nodes))

    def is_head(seq: int) -> bool:
        return seq in roots or len(nodes[nodes[seq].parent].children) > 1

    heads: dict[int, int] = {}
    out: dict[int, int | None] = {}
    for seq in nodes:
        walk = []
        at = seq
        while at not in heads and not is_head(at):
            walk.append(at)
            at = nodes[at].parent
        head = heads.get(at, at)
        for step in walk:
            heads[step] = head
        heads[at] = head
    for seq, node in nodes.items():
        if seq in roots:
            out[seq] = None
        elif is_head(seq):
            out[seq] = node.parent
        else:
            out[seq] = heads[node.parent]
    return out


TURN_LABEL_WIDTH = 32
"""Cells a turn's label may take in the tree (longer ones end in "…"): with one fork level's guides
and a scrollbar, the tree column (37 cells at most, themes/tapdeck.tcss) leaves the turn 43 of 80."""


def turn_label_width(depth: int) -> int:
    """Cells a label may take at `depth` forks down (0: a root): past the first fork level each
    level's guides (2 cells) come out of the label, so a deep label ends in "…" instead of being
    cut at the column's edge."""
    return TURN_LABEL_WIDTH - 2 * max(0, depth - 1)


def turn_label(node: TurnNode, width: int = TURN_LABEL_WIDTH) -> str:
    """Plain label of a tree node, most telling first so a cut keeps it: `#3 !warn ≈retok length
    auxiliary ⇢ids 42 tok` (number, findings badge, link kind, finish reason other than stop, role
    unless agent (the usual one), token-in mode, tokens sampled), clipped to `width`."""
    parts = [f"#{node.seq}"]
    worst = worst_level(node.findings)
    if worst is not None:
        parts.append(f"!{worst.lower()}")
    if node.kind == "retokenized":
        parts.append("≈retok")
    elif node.kind == "message":
        parts.append("~msg")
    if node.finish_reason and node.finish_reason != "stop":
        parts.append(node.finish_reason)
    if node.role != "agent":
        parts.append(node.role)
    if node.discarded and node.role != "discarded":
        parts.append("discarded")
    if node.mode == "ids":
        parts.append("⇢ids")
    elif node.mode == "text" and node.parent is not None:
        parts.append("↩text")
    if node.new_tokens is not None:
        parts.append(f"{node.new_tokens} tok")
    return clip(" ".join(parts), width)


# -- tokens -------------------------------------------------------------------------------------

def logprob_tone(logprob: float | None, masked: bool) -> str:
    """Colour class of one sampled token: masked, or how unlikely the engine found it."""
    if masked or logprob is None:
        return "masked"
    if logprob >= -0.1:
        return "sure"
    if logprob >= -1.0:
        return "mid"
    if logprob >= -3.0:
        return "low"
    return "vlow"


def token_display(text: str) -> str:
    """A token made visible: newlines as ↵ (then a real line break), tabs as →."""
    return text.replace("\n", "↵\n").replace("\t", "→")


def token_detail(turn: TurnDetail, index: int) -> str:
    """One line on a sampled token: its text, id, logprob, probability and top alternatives."""
    texts = turn.token_texts or []
    ids = turn.sampled_ids or []
    lps = turn.logprobs or []
    tops = turn.top_logprobs or []
    mask = turn.mask or []
    text = texts[index] if index < len(texts) else "?"
    parts = [f"token {index}: {text!r}"]
    if index < len(ids):
        parts.append(f"id {ids[index]}")
    lp = lps[index] if index < len(lps) else None
    if lp is not None:
        parts.append(f"logprob {lp:.3f} (p={math.exp(lp):.3f})")
    else:
        parts.append("no logprob")
    if index < len(mask) and not mask[index]:
        parts.append("masked (not trained on)")
    alternatives = tops[index] if index < len(tops) else None
    if alternatives:
        alts = ", ".join(f"{token!r} {logprob:.2f}" for token, logprob in alternatives[:5])
        parts.append(f"top: {alts}")
    else:
        parts.append("no alternatives captured (Setup: Alternatives)")
    return " · ".join(parts)


def message_text(message: Mapping[str, Any]) -> str:
    """`role: content` of one chat message (content parts and tool calls flattened)."""
    content = message.get("content")
    if isinstance(content, list):
        content = " ".join(str(p.get("text", p)) if isinstance(p, Mapping) else str(p) for p in content)
    text = f"{message.get('role', '?')}: {content or ''}"
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {}) if isinstance(call, Mapping) else {}
        text += f"\n  → {fn.get('name', '?')}({fn.get('arguments', '')})"
    return text


# -- runs ---------------------------------------------------------------------------------------

@dataclass
class GroupRow:
    """One task's group of K rollouts."""

    task: str
    total: int
    done: int
    rewards: list[float | None]
    mean: float | None
    pass_rate: float | None


_BLOCK_STARTS = ("#", "-", "*", "+", ">", "|")


def _starts_a_line(line: str) -> bool:
    """A markdown line that keeps its own line when wrapped text is joined: a heading, a list item
    (bulleted or numbered), a quote or a table row."""
    head = line.lstrip()
    number, dot, _ = head.partition(". ")
    return head.startswith(_BLOCK_STARTS) or (bool(dot) and number.isdigit())


def instruction_preview(text: str) -> str:
    """An instruction's markdown for a narrow pane: each paragraph's hard-wrapped lines joined, so
    the pane wraps it at its own width; code blocks, headings, list items, quotes and table rows
    keep their lines."""
    out: list[str] = []
    joinable = fenced = False
    for raw in text.strip().splitlines():
        line = raw.rstrip()
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            out.append(line)
            joinable = False
        elif fenced or not line:
            out.append(line)
            joinable = False
        elif joinable and not _starts_a_line(line) and not raw.startswith((" " * 4, "\t")):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
            joinable = not line.lstrip().startswith(("#", "|"))
    return "\n".join(out)


def run_groups(rollouts: Iterable[RolloutResult]) -> list[GroupRow]:
    """Per-task groups of a run: rewards, mean and pass rate over graded rollouts (`schema.runs`)."""
    by_task: dict[str, list[RolloutResult]] = {}
    for r in rollouts:
        by_task.setdefault(r.task, []).append(r)
    rows = []
    for task, items in sorted(by_task.items()):
        items = sorted(items, key=lambda r: r.index)
        rewards = [r.reward for r in items]
        done = sum(1 for r in items if r.phase in ENDED_PHASES)
        rows.append(GroupRow(task, len(items), done, rewards, mean_reward(rewards), pass_rate(rewards)))
    return rows


def run_outcomes(run: RunSummary) -> tuple[int, int]:
    """(failed, cancelled) among a run's ended rollouts. The server counts a cancelled rollout as
    not ok, among the failed; cancelling is a person's choice, not a failure (as `rollout_state`
    says), so it is counted apart, from the same summary's failures by kind."""
    cancelled = run.failures.get("cancelled", 0)
    return run.counts.failed - cancelled, cancelled


def failures_line(failures: Mapping[str, int], left_out: int = 0) -> str:
    """`failures: timeout 2, not_ok 1 · cancelled 1 · 1 task folder left out`: failures by cause,
    most first, the cancelled rollouts apart from them, and the dataset's folders that were not
    tasks Harbor could run (so never rollouts)."""
    failed = sorted(((kind, n) for kind, n in failures.items() if kind != "cancelled"),
                    key=lambda item: -item[1])
    line = "failures: " + (", ".join(f"{kind} {n}" for kind, n in failed) if failed else "none")
    cancelled = failures.get("cancelled", 0)
    if cancelled:
        line += f" · cancelled {cancelled}"
    if left_out:
        line += f" · {left_out} task folder{'' if left_out == 1 else 's'} left out"
    return line


def run_engine(run: RunSummary, width: int) -> str:
    """The engine a run's rollouts call, in at most `width` cells: "embedded", "no engine" (oracle,
    nop), or the engine's URL without its scheme and `/v1`, its host cut before its port when
    still too wide. A run from an older server says what its plan asked for."""
    used = run.engine_used or run.plan.rollout.engine
    if used == NO_ENGINE:
        return "no engine"
    short = used.split("://", 1)[-1].rstrip("/").removesuffix("/v1")
    if len(short) <= width:
        return short
    cut = min((i for i in (short.find(":"), short.find("/")) if i > 0), default=len(short))
    host, rest = short[:cut], short[cut:]
    if len(rest) > width // 2:  # a long path: its start, as any cut name
        return clip(short, width)
    return clip(host, width - len(rest)) + rest


def fmt_rate(value: Any) -> str:
    """A pass rate as a percentage, "–" when nothing was graded."""
    if value is None:
        return "–"
    return f"{float(value) * 100:.0f}%"


def ran_with(settings: ResolvedSettings, harness: str) -> str:
    """What a rollout of `harness` ran with, each value with its source: the timeouts, then the
    context, output, turns and sampling, which mean nothing where the harness calls no model."""
    if calls_a_model(harness):
        return settings.line()
    return f"{settings.timeouts_line()} (no model calls)"


def rollout_settings_line(rollout: RolloutResult, harness: str) -> str:
    """`task #i ran with: …` (`ran_with` for its run's harness), or why nothing is known yet."""
    name = f"{rollout.task} #{rollout.index}"
    if rollout.settings is None:
        return f"{name}: settings not resolved (resolved when its capture session opens)"
    tense = ("ran" if rollout.phase in ENDED_PHASES else
             "will run" if rollout.phase == "queued" else "runs")
    return f"{name} {tense} with: {ran_with(rollout.settings, harness)}"


# -- errors -------------------------------------------------------------------------------------

def describe_error(error: BaseException) -> str:
    """A line a person can act on, for any error a worker raised: the server's own message when it
    refused a request, else a plain sentence. Request paths, status codes and transport details
    are left to the log."""
    if not isinstance(error, ApiError):
        if isinstance(error, (OSError, TimeoutError)):
            return f"{type(error).__name__}: {error}"
        return f"unexpected {type(error).__name__}: {error}"
    words = error.detail
    if error.kind == "server" and (error.status == 500 or not words):
        return f"the server failed: {words}" if words else "the server failed; its log says why"
    if error.kind == "not_found" and words in (None, "Not Found"):  # FastAPI's, for no such route
        return "this server does not offer that: is it the same tapdeck version as this TUI?"
    if words:
        return words
    if error.kind == "rejected":
        return "the server refused that without saying why"
    if isinstance(error.__cause__, httpx.TimeoutException):
        return "the tapdeck server did not answer in time; is it overloaded?"
    if isinstance(error.__cause__, httpx.TransportError):
        return "the tapdeck server is not reachable; is it running?"
    if error.kind == "auth":
        return ("the server rejected the admin key: pass the key from the server's "
                "<data-dir>/admin.key with --admin-key")
    if error.kind == "bad_reply":
        return "the server's reply is not tapdeck's: is it a tapdeck server of the same version?"
    return error.message  # raised by the TUI itself, in words already (a closed event stream)
