"""What the screens show, computed from API payloads — free of Textual so it is testable alone.

Each function takes the JSON the server sent (see brief "HTTP API") and returns plain values; the
widgets only style them. Unknown or missing fields degrade to "–" instead of failing.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

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

Cell = tuple[str, str]  # (text, tone); the widget maps tones to theme colours


def session_state(summary: Mapping[str, Any]) -> str:
    """A person's word for where a session is, from the runner's `phase` metadata and its turns."""
    meta = summary.get("metadata") or {}
    phase = meta.get("phase")
    turns = summary.get("turns") or 0
    ended = phase == "done" or summary.get("state") == "closed"
    if phase == "failed" or (ended and (summary.get("fatal") or 0) > 0):
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


STATE_TONES = {"failed": "error", "finished": "success", "running": "accent", "verifying": "accent",
               "booting": "muted", "no call yet": "warning", "queued": "muted"}


def fmt_phase(rollout: Mapping[str, Any]) -> str:
    """A rollout's phase, with its progress line while it has one (an agent CLI installing)."""
    phase = str(rollout.get("phase", "?"))
    detail = rollout.get("detail")
    return f"{phase}: {detail[:40]}" if detail else phase


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


@dataclass
class _Entry:
    summary: dict
    received: float  # local monotonic time the summary arrived


@dataclass
class SessionBoard:
    """Live session summaries keyed by id; `version` grows on every change (screens poll it).

    Rollouts that have no capture session (harnesses that never call a model: oracle, nop) are kept
    too, keyed by rollout id, so every rollout of a batch shows up and reaches its end state.
    """

    entries: dict[str, _Entry] = field(default_factory=dict)
    rollouts: dict[str, dict] = field(default_factory=dict)
    finish_reasons: dict[str, str] = field(default_factory=dict)
    """Each session's last captured finish reason (from `turn_captured` events)."""
    version: int = 0

    def upsert_rollout(self, rollout: dict) -> None:
        """Take one RolloutResult (from a `rollout_updated` event or a run's detail)."""
        rid = rollout.get("rollout_id")
        if not rid:
            return
        self.rollouts[rid] = rollout
        self.version += 1

    def sessionless(self) -> dict[str, dict]:
        """Rollouts whose capture session is unknown here (none opened, or not listed)."""
        return {rid: r for rid, r in self.rollouts.items()
                if not r.get("session_id") or r["session_id"] not in self.entries}

    def replace_all(self, summaries: Iterable[dict], now: float) -> None:
        """Resynchronise from `GET /admin/sessions` (start-up or after the event stream reconnects)."""
        self.entries = {s["id"]: _Entry(s, now) for s in summaries if s.get("id")}
        self.version += 1

    def upsert(self, summary: dict, now: float) -> None:
        """Take one SessionSummary from an event."""
        if not summary.get("id"):
            return
        old = self.entries.get(summary["id"])
        if old is not None and old.summary.get("metadata") and not summary.get("metadata"):
            summary = {**summary, "metadata": old.summary["metadata"]}
        self.entries[summary["id"]] = _Entry(summary, now)
        self.version += 1

    def get(self, session_id: str) -> dict | None:
        entry = self.entries.get(session_id)
        return entry.summary if entry else None

    def idle_seconds(self, session_id: str, now: float) -> float | None:
        """Seconds since the session's last model call, advanced locally (no clock-skew trouble)."""
        entry = self.entries[session_id]
        base = entry.summary.get("seconds_since_last_call")
        if base is None:
            return None
        return float(base) + max(0.0, now - entry.received)

    def rows(self, now: float) -> dict[str, tuple[Cell, ...]]:
        """One row of cells per session (and per sessionless rollout), oldest first."""
        keyed: list[tuple[float, str, tuple[Cell, ...]]] = [
            (entry.summary.get("created_at") or 0, sid, self._row(sid, entry, now))
            for sid, entry in self.entries.items()]
        keyed += [(r.get("started_at") or r.get("created_at") or 0, rid, self._rollout_row(r))
                  for rid, r in self.sessionless().items()]
        return {key: row for _, key, row in sorted(keyed, key=lambda item: (item[0], item[1]))}

    def states(self) -> list[str]:
        """The state of every row (for the summary line)."""
        return ([session_state(e.summary) for e in self.entries.values()]
                + [session_state(_rollout_as_summary(r)) for r in self.sessionless().values()])

    def _rollout_row(self, rollout: dict) -> tuple[Cell, ...]:
        state = session_state(_rollout_as_summary(rollout))
        return (
            ("(none)", "muted"),
            (str(rollout.get("task") or "–")[:12], ""),
            (state, STATE_TONES.get(state, "")),
            (str(rollout.get("turns") or 0), ""), ("–", ""), ("–", ""), ("–", ""), ("–", ""),
            (fmt_reward(rollout.get("reward")), ""),
            (str(rollout.get("harness") or "–")[:12], ""), (str(rollout.get("run_id") or "–"), ""),
            ("–", ""), ("–", ""), ("–", ""),
        )

    def _row(self, sid: str, entry: _Entry, now: float) -> tuple[Cell, ...]:
        s = entry.summary
        meta = s.get("metadata") or {}
        state = session_state(s)
        idle = self.idle_seconds(sid, now)
        live = state in ("running", "no call yet")
        idle_tone = "idle" if live and idle is not None and idle >= IDLE_AFTER_S else ""
        task = meta.get("task") or meta.get("task_name") or ""
        return (
            (short_id(sid), ""),
            (str(task)[:12] or "–", ""),
            (state, STATE_TONES.get(state, "")),
            (str(s.get("turns", 0)), ""),
            (str(s.get("roots", 0)), ""),
            (str(s.get("forks", 0)), ""),
            (str(s.get("trainable_tokens", 0)), ""),
            ("–" if idle is None or not live else f"{int(idle)}", idle_tone),
            (fmt_reward(meta.get("reward")), ""),
            *self._wide(sid, entry, now),
        )

    def _wide(self, sid: str, entry: _Entry, now: float) -> tuple[Cell, ...]:
        """harness, run, elapsed, calls/min, last finish reason (the wide table's columns)."""
        s = entry.summary
        meta = s.get("metadata") or {}
        elapsed = session_elapsed(s, max(0.0, now - entry.received))
        turns = s.get("turns") or 0
        rate = f"{turns / (elapsed / 60):.1f}" if elapsed and turns else "–"
        return ((str(meta.get("harness") or "–")[:12], ""), (str(meta.get("run_id") or "–"), ""),
                ("–" if elapsed is None else f"{int(elapsed)}", ""), (rate, ""),
                (self.finish_reasons.get(sid, "–"), "warning" if self.finish_reasons.get(sid) == "length" else ""))


def session_elapsed(summary: Mapping[str, Any], since_received: float) -> float | None:
    """Seconds from a session's start to its last call (closed) or to now (open), on the server's
    clock: its `last_call_at` plus `seconds_since_last_call` is the server's time when it was sent."""
    created, last = summary.get("created_at"), summary.get("last_call_at")
    if created is None or last is None:
        return None
    if summary.get("state") != "open":
        return max(0.0, float(last) - float(created))
    since = summary.get("seconds_since_last_call") or 0.0
    return max(0.0, float(last) + float(since) + since_received - float(created))


def _rollout_as_summary(rollout: dict) -> dict:
    """A sessionless rollout seen as a session summary (its phase is all there is)."""
    ended = rollout.get("phase") in ("done", "failed")
    phase = "failed" if rollout.get("phase") == "done" and rollout.get("ok") is False else rollout.get("phase")
    return {"state": "closed" if ended else "open", "turns": rollout.get("turns") or 0,
            "metadata": {"phase": phase}}


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
        changed.extend((key, i, cell) for i, (cell, prev) in enumerate(zip(row, before)) if cell != prev)
    return RowDiff(removed, added, changed)


# -- rollout graph ------------------------------------------------------------------------------

@dataclass
class TurnNode:
    """One node of the rollout tree as the Rollout screen shows it."""

    seq: int
    parent: int | None
    kind: str  # root | prefix | retokenized | message
    role: str  # agent | auxiliary | discarded | …
    discarded: bool
    finish_reason: str | None
    new_tokens: int | None
    findings: list[str]
    children: list[int] = field(default_factory=list)
    mode: str | None = None
    """Token-in sessions: `ids` (continued from stored ids) or `text` (fell back); else None."""


def finding_text(finding: Any) -> str:
    """`[LEVEL] code: detail` for a finding given as text or as a dict."""
    if isinstance(finding, str):
        return finding
    if isinstance(finding, Mapping):
        level = str(finding.get("level", "INFO")).upper()
        return f"[{level}] {finding.get('code', '?')}: {finding.get('detail', finding.get('message', ''))}"
    return str(finding)


def finding_level(text: str) -> str:
    """FATAL / WARN / INFO from a formatted finding."""
    for level in ("FATAL", "WARN", "INFO"):
        if text.startswith(f"[{level}]"):
            return level
    return "INFO"


def rollout_nodes(document: Mapping[str, Any]) -> dict[int, TurnNode]:
    """The turns of a rollout document, keyed by seq, with children lists filled in."""
    roles: dict[int, str] = {}
    for sequence in document.get("sequences") or []:
        for seq in sequence.get("turns") or sequence.get("path") or sequence.get("nodes") or []:
            role = sequence.get("role")
            if role and roles.get(seq) != "agent":
                roles[int(seq)] = role
    nodes: dict[int, TurnNode] = {}
    for turn in document.get("turns") or []:
        seq = int(turn["seq"])
        kind = turn.get("link_kind") or turn.get("kind") or ("root" if turn.get("parent") is None else "prefix")
        discarded = bool(turn.get("discarded")) or turn.get("role") == "discarded" or roles.get(seq) == "discarded"
        role = turn.get("role") or roles.get(seq) or ("discarded" if discarded else "agent")
        new_tokens = turn.get("sampled_len", turn.get("completion_tokens", turn.get("n_sampled")))
        nodes[seq] = TurnNode(seq=seq, parent=turn.get("parent"), kind=str(kind), role=str(role),
                              discarded=discarded, finish_reason=turn.get("finish_reason"),
                              new_tokens=new_tokens,
                              findings=[finding_text(f) for f in turn.get("findings") or []],
                              mode=capture_mode(turn))
    for node in nodes.values():
        if node.parent is not None and node.parent in nodes:
            nodes[node.parent].children.append(node.seq)
    for node in nodes.values():
        node.children.sort()
    return nodes


def capture_mode(turn: Mapping[str, Any]) -> str | None:
    """How a token-in session sent the turn (`ids` or `text`); None outside token-in mode."""
    mode = ((turn.get("meta") or {}).get("capture_mode") or {}).get("mode")
    return str(mode) if mode else None


def capture_mode_text(turn: Mapping[str, Any]) -> str:
    """The Rollout screen's words for a turn's capture mode ("" outside token-in mode)."""
    record = (turn.get("meta") or {}).get("capture_mode") or {}
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


def turn_label(node: TurnNode) -> str:
    """Plain label of a tree node: `#3 agent ↻retok  42 tok  length`."""
    parts = [f"#{node.seq}", node.role]
    if node.kind == "retokenized":
        parts.append("≈retok")
    elif node.kind == "message":
        parts.append("~msg")
    if node.mode == "ids":
        parts.append("⇢ids")
    elif node.mode == "text" and node.parent is not None:
        parts.append("↩text")
    if node.discarded and node.role != "discarded":
        parts.append("discarded")
    if node.new_tokens is not None:
        parts.append(f"{node.new_tokens} tok")
    if node.finish_reason and node.finish_reason != "stop":
        parts.append(node.finish_reason)
    if node.findings:
        worst = min((finding_level(f) for f in node.findings), key=("FATAL", "WARN", "INFO").index)
        parts.append(f"!{worst.lower()}")
    return " ".join(parts)


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


def token_detail(turn: Mapping[str, Any], index: int) -> str:
    """One line on a sampled token: its text, id, logprob, probability and top alternatives."""
    texts = turn.get("token_texts") or []
    ids = turn.get("sampled_ids") or []
    lps = turn.get("logprobs") or []
    tops = turn.get("top_logprobs") or []
    mask = turn.get("mask") or []
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
        alts = ", ".join(f"{_alt_text(a)!r} {_alt_lp(a):.2f}" for a in alternatives[:5])
        parts.append(f"top: {alts}")
    else:
        parts.append("no alternatives captured (Setup: Alternatives)")
    return " · ".join(parts)


def _alt_text(alt: Any) -> str:
    if isinstance(alt, Mapping):
        return str(alt.get("token", alt.get("text", "?")))
    return str(alt[0])


def _alt_lp(alt: Any) -> float:
    if isinstance(alt, Mapping):
        return float(alt.get("logprob", float("nan")))
    return float(alt[1])


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


def run_groups(rollouts: Iterable[Mapping[str, Any]]) -> list[GroupRow]:
    """Per-task groups of a run: rewards, mean over graded rollouts, pass rate (reward > 0)."""
    by_task: dict[str, list[Mapping[str, Any]]] = {}
    for r in rollouts:
        by_task.setdefault(str(r.get("task", "?")), []).append(r)
    rows = []
    for task, items in sorted(by_task.items()):
        items = sorted(items, key=lambda r: r.get("index", 0))
        rewards = [r.get("reward") for r in items]
        graded = [float(x) for x in rewards if isinstance(x, (int, float)) and math.isfinite(x)]
        done = sum(1 for r in items if r.get("phase") in ("done", "failed"))
        rows.append(GroupRow(task, len(items), done, rewards,
                             sum(graded) / len(graded) if graded else None,
                             sum(1 for x in graded if x > 0) / len(graded) if graded else None))
    return rows


def failures_by_cause(rollouts: Iterable[Mapping[str, Any]]) -> Counter[str]:
    """How many rollouts failed, per classified error kind."""
    return Counter(str(r.get("error_kind") or "unknown") for r in rollouts
                   if r.get("phase") == "failed" or (r.get("phase") == "done" and r.get("ok") is False))


def fmt_rate(value: Any) -> str:
    """A pass rate as a percentage, "–" when nothing was graded."""
    if value is None:
        return "–"
    return f"{float(value) * 100:.0f}%"


def rollout_settings_line(rollout: Mapping[str, Any]) -> str:
    """`task #i ran with: …` (each value with its source), or why nothing is known yet."""
    from tapdeck.runner.rollout_settings import ResolvedSettings

    name = f"{rollout.get('task', '?')} #{rollout.get('index', '')}"
    settings = rollout.get("settings")
    if not settings:
        return f"{name}: settings not resolved (resolved when its capture session opens)"
    return f"{name} ran with: {ResolvedSettings.model_validate(settings).line()}"
