"""The rollout graph: one node per captured model call, linked by exact token prefix.

Parent of a new call = the node whose prompt+sampled ids is the longest exact prefix of the new
prompt (the node's prompt strictly shorter than the new one; ties go to the earliest arrival).
Arrival order does not matter: a late ancestor adopts the descendants that already arrived.

Memory: a node keeps only the prompt ids beyond its base (`prompt_tail`) plus its own sampled ids
and logprobs, so memory grows with unique tokens, not with turns². The full sequence is rebuilt on
demand by walking bases (`full_prompt`, `full_sequence`).

Lookup (`prefix_index.py`): each node is indexed by the hashes of its end sequence
(prompt+sampled) and of its prompt, and a new prompt's candidate ends are found without a scan of
node contents.

Only the new tokens are hashed in the common case: when the prompt starts with the last call's
ids (or those of an ancestor it extends: a retry, a fork), compares prove the shared part and
hashing resumes from that end's stored hash. Otherwise (a parallel agent, an edit, a break) every
prefix of the prompt is hashed, O(prompt) with the tiny constant above. Both give the same link.

Prefix breaks (real vLLM, see tests/fixtures/vllm/README.md) are linked visibly:
* a turn cut by `length` gets an end token the model never sampled: still an exact prefix (INFO);
* the new prompt starts with a node's prompt and its request carries that node's reply as *text*,
  but the ids differ (re-tokenisation, special tokens dropped from content, a stop string's
  tokens left out of the text): a `retokenized` edge with a WARN naming the node, the absolute
  offset where the ids diverge and, where it can tell, why;
* the messages continue a node but the prompt ids do not even start with its prompt: linked to the
  best exact prefix (or a root) with a WARN `prefix_break`, counted as a break.
Two look-alikes are named for what they are: a call that resends a node's conversation under
another system prompt (a summariser, memory extraction) is its own root with an INFO
`other_system_prompt`, not a break; a retokenized-looking edge whose request resends the parent's
reply without the reasoning it sampled (gemini-cli drops thought parts) gets `reasoning_dropped`.
Nothing is rebuilt by concatenating ids across a break: each segment keeps its own engine ids.

Calls without ids (text/logprobs tiers) are linked by message prefix (`message` edges).
Not thread-safe: the caller serialises `add` per session.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from tapdeck.proxy.capture.message_chain import chain_hashes, conversation, system_prompt
from tapdeck.proxy.capture.prefix_index import HASHER, Key, LengthIndex
from tapdeck.proxy.capture.tokens import ID_DTYPE, as_ids
from tapdeck.proxy.capture.turn import Turn
from tapdeck.schema.findings import Finding, has_fatal
from tapdeck.schema.sessions import RolloutStats

LinkKind = Literal["root", "prefix", "retokenized", "message"]
Role = Literal["agent", "auxiliary", "discarded"]

_LOGPROB_SLACK = 1e-6
"""Logprobs up to this above 0 are float rounding of log(1), not a positive logprob."""


def _reasoning_dropped(cand: Node, conv: list[dict[str, Any]]) -> bool:
    """The candidate sampled reasoning, and the new request resends its reply without any."""
    response = cand.turn.response or {}
    sampled = response.get("reasoning") or response.get("reasoning_content")
    if not sampled or len(conv) < cand.conv_len:
        return False
    resent = conv[cand.conv_len - 1]
    return not (resent.get("reasoning") or resent.get("reasoning_content"))


# ---------------------------------------------------------------------------------------------
# public data


@dataclass
class Link:
    """How a call was attached when it arrived.

    `offset`: for `prefix`, where the new tokens start (the parent's prompt+sampled length);
    for `retokenized`, the absolute index where the ids diverge from the parent's; else None.
    `adopted`: earlier-arrived calls this one became the parent of (a late ancestor).
    """

    seq: int
    parent: int | None
    kind: LinkKind
    offset: int | None
    findings: list[Finding] = field(default_factory=list)
    adopted: list[int] = field(default_factory=list)


@dataclass(eq=False)
class Node:
    """One call in the graph. `turn.prompt_ids` is None here: the prompt is held as a delta."""

    seq: int
    turn: Turn
    has_prompt: bool
    prompt_len: int
    sampled: np.ndarray | None
    trainable: bool
    tools: bool
    parent: int | None = None
    kind: LinkKind = "root"
    offset: int | None = None
    base_len: int = 0
    prompt_tail: np.ndarray | None = None
    children: list[int] = field(default_factory=list)
    end_key: Key | None = None
    prompt_key: Key | None = None
    conv_len: int = 0
    conv_hash: bytes | None = None
    break_of: int | None = None
    link_findings: list[Finding] = field(default_factory=list)

    @property
    def sampled_len(self) -> int:
        return 0 if self.sampled is None else int(self.sampled.size)

    @property
    def full_len(self) -> int:
        return self.prompt_len + self.sampled_len


@dataclass
class _Tally:
    """What `RolloutGraph.stats` counts, kept per attached call (discarded calls excluded from
    the last three)."""

    children: int = 0
    """Calls with a parent."""
    parents: int = 0
    """Calls with at least one child."""
    root_groups: int = 0
    """Distinct root keys among the roots (identical-prompt roots share one)."""
    broken_roots: int = 0
    retokenized: int = 0
    broken: int = 0
    """Calls with `break_of` set."""
    tool_calls: int = 0
    trainable: int = 0
    """Sampled ids of trainable calls not marked auxiliary."""
    tool_trainable: int = 0
    """The same, of calls that carry tools."""


@dataclass
class Sequence:
    """One training sequence: a token-contiguous run of nodes (split at prefix breaks)."""

    nodes: list[int]
    role: Role
    input_ids: np.ndarray | None
    loss_mask: np.ndarray | None
    logprobs: np.ndarray | None
    spans: list[tuple[int, int, int]]
    """(seq, start, end) of each node's sampled span in sequence coordinates."""


def turn_trainable(turn: Turn) -> bool:
    """Ids and aligned, finite, non-positive logprobs, and no FATAL finding on the turn."""
    if turn.prompt_ids is None or turn.sampled_ids is None or turn.logprobs is None:
        return False
    lp = np.asarray(turn.logprobs, dtype=np.float64)
    if lp.shape != (len(turn.sampled_ids),) or lp.size == 0:
        return False
    # Finite and at most the slack, in two reductions: a NaN fails both compares, ±inf one each.
    if not (lp.max() <= _LOGPROB_SLACK and lp.min() > -np.inf):
        return False
    for arr in (turn.prompt_ids, turn.sampled_ids):
        a = np.asarray(arr)
        if a.size and (a.dtype.kind not in "iu" or a.min() < 0):
            return False
    return not has_fatal(turn.findings)


def _has_tools(request: dict[str, Any]) -> bool:
    return bool(request.get("tools") or request.get("functions"))


def _is_special(text: str | None) -> bool:
    return text is not None and text.startswith("<") and text.endswith(">") and "|" in text


# ---------------------------------------------------------------------------------------------
# the graph


class RolloutGraph:
    """Nodes per call, linked by exact token prefix (message prefix when there are no ids)."""

    def __init__(self) -> None:
        self._nodes: dict[int, Node] = {}
        self._roots: list[int] = []
        self._ends = LengthIndex()
        self._prompts = LengthIndex()
        self._conv: dict[bytes, list[int]] = {}
        self._root_groups: dict[Any, list[int]] = {}
        # The last call with ids: its prompt and sampled arrays (one prompt's memory per graph).
        self._hot: tuple[int, np.ndarray, np.ndarray | None] | None = None
        self._tally = _Tally()
        self._dropped: set[int] = set()
        """Discarded calls (`discarded`), kept as calls attach and detach, for `stats`."""

    # -- queries ---------------------------------------------------------------------------

    @property
    def nodes(self) -> dict[int, Node]:
        """Nodes by arrival index."""
        return self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def roots(self) -> list[int]:
        """Root nodes in arrival order."""
        return sorted(self._roots)

    def children(self, seq: int) -> list[int]:
        """Children of a node in arrival order."""
        return sorted(self._nodes[seq].children)

    def link(self, seq: int) -> Link:
        """The node's current link (it may have changed since `add` through adoption)."""
        n = self._nodes[seq]
        return Link(seq, n.parent, n.kind, n.offset, list(n.link_findings))

    def turn(self, seq: int) -> Turn:
        """The captured call with its full prompt ids rebuilt."""
        n = self._nodes[seq]
        return dataclasses.replace(n.turn, prompt_ids=self.full_prompt(seq) if n.has_prompt else None)

    def full_prompt(self, seq: int) -> np.ndarray:
        """Exactly the prompt ids the engine returned for this call.

        Walks the bases upward collecting only the slices still needed, then concatenates
        once: O(prompt + depth), no intermediate copies.
        """
        n = self._nodes[seq]
        if n.prompt_tail is None:
            return np.zeros(0, dtype=ID_DTYPE)
        pieces = [n.prompt_tail]
        need = n.base_len
        while need > 0:
            # A base is a prefix of the parent's ids, held as its prompt's tail and its sampled ids.
            assert n.parent is not None
            p = self._nodes[n.parent]
            own = need - p.base_len
            tail = p.prompt_tail
            assert tail is not None
            if own > tail.size:
                assert p.sampled is not None
                pieces.append(p.sampled[: own - tail.size])
                pieces.append(tail)
            else:
                pieces.append(tail[:own])
            need = p.base_len
            n = p
        if len(pieces) == 1:
            return pieces[0].copy()
        return np.concatenate(pieces[::-1])

    def held_turn(self, request: dict[str, Any]) -> tuple[int, int] | None:
        """`(seq, new)`: the latest call with ids whose messages and reply (compared as text) start
        `request`'s conversation under the same system prompt, followed by `new` > 0 messages;
        None when the request extends no call held here (a new root, an edited history)."""
        conv = conversation(request)
        hashes = chain_hashes(conv)
        system = None
        for k in range(len(hashes) - 1, 0, -1):
            for s in sorted(self._conv.get(hashes[k - 1], []), reverse=True):
                n = self._nodes[s]
                if not (n.has_prompt and n.sampled_len and n.conv_len == k):
                    continue
                if system is None:
                    system = system_prompt(request)
                if system_prompt(n.turn.request) == system:
                    return s, len(conv) - k
        return None

    def full_sequence(self, seq: int) -> np.ndarray:
        """Prompt ids plus sampled ids of this call."""
        n = self._nodes[seq]
        if n.sampled is None or not n.sampled.size:
            return self.full_prompt(seq)
        return np.concatenate([self.full_prompt(seq), n.sampled])

    def paths(self) -> list[list[int]]:
        """Every root→leaf path, ordered by the leaf's arrival."""
        out: list[list[int]] = []
        for root in self.roots():
            stack = [[root]]
            while stack:
                path = stack.pop()
                kids = self._nodes[path[-1]].children
                if not kids:
                    out.append(path)
                for k in kids:
                    stack.append(path + [k])
        out.sort(key=lambda p: p[-1])
        return out

    def discarded(self, seq: int) -> bool:
        """A childless call whose sibling (same parent, or an identical-prompt root) continued."""
        n = self._nodes[seq]
        if n.children:
            return False
        if n.parent is not None:
            siblings = self._nodes[n.parent].children
        else:
            siblings = self._root_groups.get(self._root_key(n), [])
        return any(s != seq and self._nodes[s].children for s in siblings)

    def has_tools(self) -> bool:
        """True when any live (not discarded) call carried a tool manifest."""
        return any(n.tools and not self.discarded(n.seq) for n in self._nodes.values())

    def node_role(self, seq: int, *, tools: bool | None = None) -> Role:
        """agent / auxiliary / discarded for one call (capture-cases H).

        Auxiliary: a call the proxy marked so (`meta.call_role`: structured output asked, see
        json_mode), or one without tools in a rollout whose calls carry tools (title, router,
        loop-detection and other side calls)."""
        if self.discarded(seq):
            return "discarded"
        if self._nodes[seq].turn.meta.get("call_role") == "auxiliary":
            return "auxiliary"
        if tools is None:
            tools = self.has_tools()
        if not tools or self._nodes[seq].tools:
            return "agent"
        return "auxiliary"

    def role(self, path: list[int]) -> Role:
        """Role of a root→leaf path: discarded leaf → discarded; any agent call → agent."""
        if self.discarded(path[-1]):
            return "discarded"
        tools = self.has_tools()
        if any(self.node_role(s, tools=tools) == "agent" for s in path):
            return "agent"
        return "auxiliary"

    def node_mask_on(self, seq: int, *, tools: bool | None = None) -> bool:
        """Whether this call's sampled ids are trained (agent role and trainable)."""
        return self._nodes[seq].trainable and self.node_role(seq, tools=tools) == "agent"

    def sequences(self) -> list[Sequence]:
        """Training sequences: each path split at re-tokenised edges, de-duplicated.

        A segment's ids are exactly the engine's ids of its last call (earlier calls of the
        segment are exact prefixes of it). Sampled spans of agent, trainable calls get mask 1;
        everything else (context, auxiliary or discarded calls, untrainable turns) mask 0.
        """
        tools = self.has_tools()
        priority = {"agent": 0, "auxiliary": 1, "discarded": 2}
        found: dict[tuple[int, ...], Role] = {}
        order: list[tuple[int, ...]] = []
        for path in self.paths():
            role = self.role(path)
            segments: list[list[int]] = []
            seg: list[int] = []
            for s in path:
                if seg and self._nodes[s].kind == "retokenized":
                    segments.append(seg)
                    seg = []
                seg.append(s)
            segments.append(seg)
            for part in segments:
                key = tuple(part)
                if key not in found:
                    order.append(key)
                    found[key] = role
                elif priority[role] < priority[found[key]]:
                    found[key] = role
        return [self._build_sequence(list(k), found[k], tools) for k in order]

    def _build_sequence(self, nodes: list[int], role: Role, tools: bool) -> Sequence:
        last = self._nodes[nodes[-1]]
        if not all(self._nodes[s].has_prompt and self._nodes[s].sampled is not None for s in nodes):
            spans = [(s, -1, -1) for s in nodes]
            return Sequence(nodes, role, None, None, None, spans)
        ids = self.full_sequence(last.seq)
        mask = np.zeros(ids.size, dtype=np.int8)
        lps = np.zeros(ids.size, dtype=np.float64)
        spans = []
        for s in nodes:
            n = self._nodes[s]
            start, end = n.prompt_len, n.full_len
            spans.append((s, start, end))
            if self.node_mask_on(s, tools=tools):
                mask[start:end] = 1
                lps[start:end] = np.asarray(n.turn.logprobs, dtype=np.float64)
        return Sequence(nodes, role, ids, mask, lps, spans)

    def findings(self) -> list[Finding]:
        """Every turn and link finding, in arrival order."""
        out: list[Finding] = []
        for s in sorted(self._nodes):
            n = self._nodes[s]
            out.extend(n.turn.findings)
            out.extend(n.link_findings)
        return out

    def stats(self) -> RolloutStats:
        """Turns, roots, forks, breaks, discarded, trainable tokens over unique turns, fragmentation.

        From counts kept as calls attach and detach (`_attach`, `_detach`): this runs on every
        commit, and a pass over the nodes made a long rollout's commits quadratic."""
        t = self._tally
        roots = len(self._roots)
        duplicate_roots = roots - t.root_groups
        forks = t.children - t.parents + duplicate_roots
        conversations = max(0, roots - t.broken_roots - duplicate_roots)
        breaks = t.retokenized + t.broken
        frag = (conversations + breaks) / max(conversations, 1) if self._nodes else 0.0
        return RolloutStats(
            turns=len(self._nodes),
            roots=roots,
            forks=forks,
            breaks=breaks,
            discarded=len(self._dropped),
            trainable_tokens=t.tool_trainable if t.tool_calls else t.trainable,
            fragmentation=round(frag, 4),
            conversations=conversations,
        )

    def mark_auxiliary(self, seq: int, reason: str) -> None:
        """Demote a call to auxiliary after the fact (`meta.call_role`, which `node_role` reads),
        keeping the counts `stats` reports in step."""
        node = self._nodes[seq]
        live = seq not in self._dropped
        if live:
            self._count_live(node, -1)
        node.turn.meta.update(call_role="auxiliary", auxiliary_reason=reason)
        if live:
            self._count_live(node, 1)

    def demote(self, seqs: Iterable[int], reason: str) -> None:
        """Mark these calls auxiliary (those the graph holds; others are skipped)."""
        for seq in seqs:
            if seq in self._nodes:
                self.mark_auxiliary(seq, reason)

    # -- adding ----------------------------------------------------------------------------

    def add(self, turn: Turn) -> Link:
        """Link one captured call; re-parent calls that arrived earlier but descend from it."""
        if turn.seq in self._nodes:
            raise ValueError(f"turn {turn.seq} is already in the graph")
        has_prompt = turn.prompt_ids is not None
        prompt = as_ids(turn.prompt_ids) if has_prompt else np.zeros(0, dtype=ID_DTYPE)
        sampled = as_ids(turn.sampled_ids) if turn.sampled_ids is not None else None
        held = copy.copy(turn)  # a plain dataclass: what `dataclasses.replace` makes, for less
        held.prompt_ids = None
        node = Node(
            seq=turn.seq,
            turn=held,
            has_prompt=has_prompt,
            prompt_len=int(prompt.size),
            sampled=sampled,
            trainable=turn_trainable(turn),
            tools=_has_tools(turn.request),
        )
        conv = conversation(turn.request)
        node.conv_len = len(conv) + 1
        if has_prompt:
            self._set_keys(node, self._link_by_tokens(node, prompt, conv))
        else:
            self._link_by_messages(node, conv)
        self._insert(node)
        self._finish_conv_hash(node, conv)
        if has_prompt:
            self._hot = (node.seq, prompt, sampled)
        adopted = self._adopt_into(node)
        return Link(node.seq, node.parent, node.kind, node.offset, list(node.link_findings), adopted)

    @staticmethod
    def _set_keys(node: Node, prompt_hash: tuple[int, int]) -> None:
        """The node's prompt and end keys (the sampled ids hashed on from the prompt's hash)."""
        n = node.prompt_len
        node.prompt_key = (n, *prompt_hash)
        s = node.sampled
        if s is not None and s.size:
            e1, e2 = HASHER.prefix_hashes(s, n, prompt_hash)
            node.end_key = (n + s.size, int(e1[-1]), int(e2[-1]))
        else:
            node.end_key = node.prompt_key

    def _hot_start(self, prompt: np.ndarray) -> tuple[int, tuple[int, int]] | None:
        """`(L, hashes)`: the longest end (prompt+sampled ids, length L) of the last call or of
        an ancestor it extends by exact prefix, that the prompt starts with.

        The common agent step extends the last call, a retry or fork extends one of its
        ancestors; then only the ids beyond L are hashed, and compares (memcmp-like) prove the
        shared part, so linking costs what the new tokens cost.
        """
        if self._hot is None:
            return None
        seq, hot_prompt, hot_sampled = self._hot
        node = self._nodes.get(seq)
        if node is None:
            return None
        a = hot_prompt.size
        shared = self._first_mismatch(prompt, hot_prompt)
        if shared == a and hot_sampled is not None:
            shared += self._first_mismatch(prompt[a:], hot_sampled)
        # The last call and each call it extends by prefix have ids, so their keys are set.
        end = node.end_key
        assert end is not None
        while end[0] > shared or not end[0]:
            if node.kind != "prefix":
                return None
            assert node.parent is not None
            node = self._nodes[node.parent]
            end = node.end_key
            assert end is not None
        return end[0], end[1:]

    def _link_by_tokens(self, node: Node, prompt: np.ndarray, conv: list[dict[str, Any]]) -> tuple[int, int]:
        """Link by the longest exact token prefix; returns the prompt's hashes.

        Tries the window beyond the last call first; only when no call at or beyond it is an
        exact parent are all of the prompt's prefixes hashed. Both give the same link.
        """
        n = prompt.size

        def is_end(s: int) -> bool:
            return s != node.seq and self._nodes[s].has_prompt and self._nodes[s].prompt_len < n

        best = None
        hot = self._hot_start(prompt)
        if hot is not None:
            base = hot[0]
            g1, g2 = HASHER.window(prompt, base, hot[1])
            best = self._ends.longest(g1, g2, base, 0, n, accept=is_end)
        if best is None:
            base = 0
            g1, g2 = HASHER.window(prompt)
            best = self._ends.longest(g1, g2, base, 0, n, accept=is_end)
        exact = best[1][0] if best else None
        exact_len = best[0] if best else 0
        # A deeper call whose prompt (not its reply) starts this prompt: maybe a re-tokenisation.
        retok = self._prompts.longest(
            g1,
            g2,
            base,
            max(0, exact_len - 1),
            n - 1,
            accept=lambda s: (
                s != node.seq and self._nodes[s].sampled_len > 0 and self._nodes[s].prompt_len < n
            ),
        )
        prompt_hash = (int(g1[-1]), int(g2[-1]))
        if retok is not None:
            cand = self._nodes[retok[1][0]]
            deeper = exact is None or cand.conv_len > self._nodes[exact].conv_len
            if deeper and self._continues_as_text(cand, conv):
                self._set_link(node, cand.seq, "retokenized", self._divergence(cand, prompt), prompt)
                if _reasoning_dropped(cand, conv):
                    node.link_findings = [
                        Finding.warn(
                            "reasoning_dropped",
                            f"the agent resent turn {cand.seq}'s reply without the reasoning it sampled "
                            f"(thought parts left out of its history), so the ids diverge at offset "
                            f"{node.offset}: a new segment, not a re-tokenisation",
                            turn=node.seq,
                        )
                    ]
                return prompt_hash
        if exact is not None:
            self._set_link(node, exact, "prefix", exact_len, prompt)
        else:
            self._set_link(node, None, "root", None, prompt)
        self._check_message_break(node, conv, prompt, exact)
        return prompt_hash

    def _link_by_messages(self, node: Node, conv: list[dict[str, Any]]) -> None:
        hashes = chain_hashes(conv)
        for i in range(len(hashes), 0, -1):
            seqs = [s for s in self._conv.get(hashes[i - 1], []) if s != node.seq]
            if seqs:
                self._set_link(node, min(seqs), "message", None, None)
                return
        self._set_link(node, None, "root", None, None)

    def _continues_as_text(self, cand: Node, conv: list[dict[str, Any]]) -> bool:
        """The new request holds the candidate's messages and its reply, compared as text."""
        k = cand.conv_len
        if len(conv) < k:
            return False
        return chain_hashes(conv[:k])[-1] == self._conv_hash(cand)

    @staticmethod
    def _divergence(cand: Node, prompt: np.ndarray) -> int:
        """Absolute index where the new prompt stops matching the candidate's prompt+sampled."""
        start = cand.prompt_len
        s = cand.sampled if cand.sampled is not None else np.zeros(0, dtype=ID_DTYPE)
        m = min(s.size, prompt.size - start)
        diff = np.flatnonzero(prompt[start : start + m] != s[:m])
        return start + (int(diff[0]) if diff.size else m)

    def _check_message_break(
        self, node: Node, conv: list[dict[str, Any]], prompt: np.ndarray, exact: int | None
    ) -> None:
        """Messages continue a deeper call than the token prefix explains: a visible break.

        Checked for roots, and for prefix links only when the messages beyond the parent hold an
        assistant reply (history the parent does not explain), so the common case (one new
        observation after an exact prefix) hashes no message text.
        """
        floor = 0
        if exact is not None:
            floor = self._nodes[exact].conv_len
            if not any((m.get("role") or "assistant") == "assistant" for m in conv[floor:]):
                return
        hashes = chain_hashes(conv)
        for i in range(len(hashes), floor, -1):
            seqs = [s for s in self._conv.get(hashes[i - 1], []) if s != node.seq]
            if seqs:
                other = self._nodes[min(seqs)]
                if not other.has_prompt:
                    return
                if system_prompt(node.turn.request) != system_prompt(other.turn.request):
                    node.link_findings.append(
                        Finding.info(
                            "other_system_prompt",
                            f"resends turn {other.seq}'s conversation under another system prompt (a "
                            f"side call such as a summariser or memory extraction, or a system prompt "
                            f"the agent changed): its own root, not a break of sampled text",
                            turn=node.seq,
                        )
                    )
                    return
                node.break_of = other.seq
                at = self._first_mismatch(self.full_sequence(other.seq), prompt)
                node.link_findings.append(
                    Finding.warn(
                        "prefix_break",
                        f"messages continue turn {other.seq} but the prompt ids diverge from its ids "
                        f"at offset {at}; linked as {node.kind}"
                        + (f" to turn {node.parent}" if node.parent is not None else ""),
                        turn=node.seq,
                    )
                )
                return

    @staticmethod
    def _first_mismatch(a: np.ndarray, b: np.ndarray) -> int:
        """Length of the common prefix of `a` and `b`."""
        m = min(a.size, b.size)
        if np.array_equal(a[:m], b[:m]):
            return m
        diff = np.flatnonzero(a[:m] != b[:m])
        return int(diff[0]) if diff.size else m

    def _set_link(
        self, node: Node, parent: int | None, kind: LinkKind, offset: int | None, prompt: np.ndarray | None
    ) -> None:
        """Attach `node` under `parent`, keeping only the prompt ids beyond the shared prefix."""
        node.parent, node.kind, node.offset = parent, kind, offset
        node.base_len = offset if kind in ("prefix", "retokenized") and offset else 0
        node.break_of = None
        node.link_findings = []
        if node.has_prompt and prompt is not None:
            node.prompt_tail = np.array(prompt[node.base_len :], dtype=ID_DTYPE, copy=True)
        if parent is None:
            return
        p = self._nodes[parent]
        if kind == "prefix" and p.turn.finish_reason == "length":
            extra = node.prompt_tail[:3].tolist() if node.prompt_tail is not None else []
            node.link_findings.append(
                Finding.info(
                    "truncated_parent",
                    f"turn {parent} was cut by length; this prompt continues at offset {offset} with "
                    f"ids {extra} the model never sampled (context, mask 0)",
                    turn=node.seq,
                )
            )
        if kind == "retokenized":
            assert offset is not None  # a retokenized link always says where the ids diverge
            j = offset - p.prompt_len
            why = "the reply's text re-tokenises to other ids"
            texts = p.turn.token_texts
            stop = p.turn.meta.get("stop_string")
            # Generation ends on the token completing the stop string, which spans at most its
            # byte length in tokens: a divergence there is the string left out of the text.
            if isinstance(stop, str) and j >= p.sampled_len - len(stop.encode()):
                why = (
                    f"turn {parent} stopped on the stop string {stop!r}, whose sampled tokens "
                    "its reply's text leaves out"
                )
            elif texts and 0 <= j < len(texts) and _is_special(texts[j]):
                why = f"special token {texts[j]!r} inside the reply (dropped from its text)"
            if p.turn.finish_reason == "length":
                why += f"; turn {parent} was also cut by length"
            node.link_findings.append(
                Finding.warn(
                    "retokenized",
                    f"prompt continues turn {parent}'s reply as text but the ids diverge at offset "
                    f"{offset} (reply token {j}): {why}",
                    turn=node.seq,
                )
            )

    def _insert(self, node: Node) -> None:
        self._nodes[node.seq] = node
        self._attach(node)
        if node.has_prompt:
            assert node.end_key is not None and node.prompt_key is not None  # set with the ids
            self._ends.add(node.end_key, node.seq)
            self._prompts.add(node.prompt_key, node.seq)

    def _attach(self, node: Node) -> None:
        t = self._tally
        if node.parent is None:
            self._roots.append(node.seq)
            group = self._root_groups.setdefault(self._root_key(node), [])
            group.append(node.seq)
            t.root_groups += len(group) == 1
            t.broken_roots += node.break_of is not None
            new_parent = None
        else:
            parent = self._nodes[node.parent]
            parent.children.append(node.seq)
            t.children += 1
            t.parents += len(parent.children) == 1
            new_parent = parent if len(parent.children) == 1 else None
        t.retokenized += node.kind == "retokenized"
        t.broken += node.break_of is not None
        self._count_live(node, 1)
        self._recheck_discarded(self._siblings(node))
        if new_parent is not None:  # its first child: its siblings may be discarded now, it not
            self._recheck_discarded(self._siblings(new_parent))

    def _detach(self, node: Node) -> None:
        t = self._tally
        if node.seq in self._dropped:
            self._dropped.discard(node.seq)
        else:
            self._count_live(node, -1)
        t.retokenized -= node.kind == "retokenized"
        t.broken -= node.break_of is not None
        if node.parent is None:
            self._roots.remove(node.seq)
            group = self._root_groups[self._root_key(node)]
            group.remove(node.seq)
            t.root_groups -= not group
            t.broken_roots -= node.break_of is not None
            self._recheck_discarded(group)
        else:
            parent = self._nodes[node.parent]
            parent.children.remove(node.seq)
            t.children -= 1
            self._recheck_discarded(parent.children)
            if not parent.children:  # its siblings may no longer be discarded, itself may be
                t.parents -= 1
                self._recheck_discarded(self._siblings(parent))

    def _siblings(self, node: Node) -> list[int]:
        """The calls `discarded` compares `node` with, itself included."""
        if node.parent is not None:
            return self._nodes[node.parent].children
        return self._root_groups.get(self._root_key(node), [])

    def _recheck_discarded(self, siblings: list[int]) -> None:
        """`discarded` of each of one parent's children (or one root group), updated in `_dropped`."""
        continued = any(self._nodes[s].children for s in siblings)
        for s in siblings:
            node = self._nodes[s]
            drop = continued and not node.children
            if drop != (s in self._dropped):
                if drop:
                    self._dropped.add(s)
                else:
                    self._dropped.discard(s)
                self._count_live(node, -1 if drop else 1)

    def _count_live(self, node: Node, sign: int) -> None:
        """Add (`sign` 1) or take back (-1) a not discarded call's tools and trainable tokens."""
        t = self._tally
        tokens = (
            node.sampled.size
            if node.trainable and node.sampled is not None and node.turn.meta.get("call_role") != "auxiliary"
            else 0
        )
        t.trainable += sign * tokens
        if node.tools:
            t.tool_calls += sign
            t.tool_trainable += sign * tokens

    def _root_key(self, node: Node) -> Any:
        if node.has_prompt:
            return ("ids", node.prompt_key)
        if node.conv_hash is None:
            self._conv_hash(node)
        return ("msgs", node.conv_len, self._request_hash(node))

    @staticmethod
    def _request_hash(node: Node) -> bytes:
        hashes = chain_hashes(conversation(node.turn.request))
        return hashes[-1] if hashes else b""

    def _conv_hash(self, node: Node) -> bytes:
        if node.conv_hash is None:
            msgs = conversation(node.turn.request) + [node.turn.response or {}]
            node.conv_hash = chain_hashes(msgs)[-1]
        return node.conv_hash

    def _finish_conv_hash(self, node: Node, conv: list[dict[str, Any]]) -> None:
        """Index the call's conversation (request + reply) by message hash.

        After an exact token link the parent's messages rendered to the same ids, so only the
        messages beyond the parent's conversation are hashed (cost ∝ new messages).
        """
        p = self._nodes[node.parent] if node.parent is not None else None
        if (
            node.conv_hash is None
            and p is not None
            and node.kind == "prefix"
            and p.conv_hash is not None
            and len(conv) >= p.conv_len
        ):
            node.conv_hash = chain_hashes(conv[p.conv_len :] + [node.turn.response or {}], start=p.conv_hash)[
                -1
            ]
        self._conv.setdefault(self._conv_hash(node), []).append(node.seq)

    # -- adoption --------------------------------------------------------------------------

    def _adopt_into(self, new: Node) -> list[int]:
        """Re-link earlier arrivals the new call may now be the parent of.

        Candidates are only the calls that could have hung where `new` would: the new call's
        siblings (or the roots when it is a root) and the children of calls with the same
        prompt+sampled ids or the same prompt (whose children may hang there by re-tokenisation). Each
        candidate is cheaply pre-checked (its prompt starts with the new call's prompt), then re-linked with
        the same rule as `add`, so the graph is the one in-order arrival would have built.
        """
        cands: set[int] = set(self._roots if new.parent is None else self._nodes[new.parent].children)
        if new.has_prompt:
            assert new.end_key is not None and new.prompt_key is not None  # set with the ids
            for twin in self._ends.get(new.end_key) + self._prompts.get(new.prompt_key):
                cands.update(self._nodes[twin].children)
        cands.discard(new.seq)
        adopted = []
        for s in sorted(cands):
            c = self._nodes[s]
            if not self._may_descend(new, c):
                continue
            before = (c.parent, c.kind, c.offset)
            self._relink(c)
            if (c.parent, c.kind, c.offset) != before and c.parent == new.seq:
                adopted.append(s)
        return adopted

    def _may_descend(self, new: Node, c: Node) -> bool:
        """c's prompt starts with new's prompt (ids), or its messages with new's conversation."""
        if new.has_prompt != c.has_prompt:
            return False
        if not new.has_prompt:
            if c.conv_len <= new.conv_len:
                return False
            hashes = chain_hashes(conversation(c.turn.request)[: new.conv_len])
            return len(hashes) == new.conv_len and hashes[-1] == self._conv_hash(new)
        n = new.prompt_len
        if n >= c.prompt_len:
            return False
        if new.parent == c.parent and new.base_len == c.base_len:
            # Same base: the shared part is identical, compare only the new ids.
            t = new.prompt_tail
            assert t is not None and c.prompt_tail is not None  # both have ids
            return bool(np.array_equal(c.prompt_tail[: t.size], t))
        return bool(np.array_equal(self.full_prompt(c.seq)[:n], self.full_prompt(new.seq)))

    def _relink(self, c: Node) -> None:
        prompt = self.full_prompt(c.seq) if c.has_prompt else None
        self._detach(c)
        conv = conversation(c.turn.request)
        if prompt is not None:
            self._link_by_tokens(c, prompt, conv)
        else:
            self._link_by_messages(c, conv)
        self._attach(c)
