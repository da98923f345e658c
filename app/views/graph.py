"""The Rollout screen's tree of one session's turns: its nodes, where each is listed (only forks
nest), and each turn's label."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tapdeck.app.views.text import clip
from tapdeck.schema.findings import Finding, Level
from tapdeck.schema.sessions import GraphTurn, GraphView, PolicySpan, PolicyVersion, RolloutStats


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
    policy: str = ""
    """The policy version that sampled it, as `policy_text` writes it ("" when unknown)."""


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
            known = self.turns.get(seq)
            if known is None:
                self.missing.add(seq)
            elif (known.parent, known.role) != (parent, role):
                self.turns[seq] = known.model_copy(update={"parent": parent, "role": role})
                changed = True
        self.stats, self.findings, self.tier = view.stats, view.findings, str(view.tier)
        return changed


def rollout_nodes(turns: Iterable[GraphTurn]) -> dict[int, TurnNode]:
    """The tree's nodes from turn headers, keyed by seq, with children lists filled in."""
    nodes = {
        turn.seq: TurnNode(
            seq=turn.seq,
            parent=turn.parent,
            kind=turn.link_kind,
            role=turn.role,
            discarded=turn.role == "discarded",
            finish_reason=turn.finish_reason,
            new_tokens=turn.sampled_len,
            findings=list(turn.findings),
            mode=turn.token_in,
            policy=policy_text(turn.policy_version, turn.policy_version_straddled),
        )
        for turn in turns
    }
    for node in nodes.values():
        if node.parent is not None and node.parent in nodes:
            nodes[node.parent].children.append(node.seq)
    for node in nodes.values():
        node.children.sort()
    return nodes


def policy_text(
    version: PolicyVersion | None, straddled: tuple[PolicyVersion | None, PolicyVersion | None] | None
) -> str:
    """A turn's policy version in a few cells: `v3`, `v2→3` for a call that straddled an update
    (`?` for a reading that said nothing), "" when unknown."""
    if straddled is not None:
        before, after = ("?" if v is None else v for v in straddled)
        return f"v{before}→{after}"
    return "" if version is None else f"v{version}"


def policy_span_text(span: PolicySpan | None) -> str:
    """A rollout's span of policy versions: `policy v0–2 (1 straddled)`, `policy v3`, "" if none."""
    if span is None:
        return ""
    text = f"policy v{span.oldest}" + ("" if span.newest == span.oldest else f"–{span.newest}")
    return text + (f" ({span.straddled} straddled)" if span.straddled else "")


def capture_mode_text(meta: Mapping[str, Any]) -> str:
    """The Rollout screen's words for a turn's capture mode ("" outside token-in mode)."""
    record = meta.get("capture_mode") or {}
    if record.get("mode") == "ids":
        same = (
            "same ids as text"
            if record.get("same")
            else f"text path would differ from offset {record.get('diverge_at')}"
        )
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
    # The parent of every turn but the roots (so one among `nodes`).
    parents = {
        seq: node.parent for seq, node in nodes.items() if node.parent is not None and node.parent in nodes
    }

    def is_head(seq: int) -> bool:
        return seq in roots or len(nodes[parents[seq]].children) > 1

    heads: dict[int, int] = {}
    out: dict[int, int | None] = {}
    for seq in nodes:
        walk = []
        at = seq
        while at not in heads and not is_head(at):
            walk.append(at)
            at = parents[at]
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
            out[seq] = heads[parents[seq]]
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
    auxiliary ⇢ids v2 42 tok` (number, findings badge, link kind, finish reason other than stop,
    role unless agent (the usual one), token-in mode, policy version, tokens sampled), clipped to
    `width`."""
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
    if node.policy:
        parts.append(node.policy)
    if node.new_tokens is not None:
        parts.append(f"{node.new_tokens} tok")
    return clip(" ".join(parts), width)
