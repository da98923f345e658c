"""`RolloutGraph.stats` is kept as calls attach and detach; it must always say what a full pass
over the graph's per-call queries says, whatever arrives in whatever order (hypothesis)."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.capture.turn import Turn
from tapdeck.schema.sessions import RolloutStats

TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
SYSTEM = {"role": "system", "content": "You are a shell agent."}
KINDS = ("extend", "extend", "retry", "retokenize", "break", "root", "no_ids")
"""How each generated call derives from an earlier one (extending is the common step)."""


def recounted(g: RolloutGraph) -> RolloutStats:
    """The stats by one pass over every call, from the per-call queries (what `stats` summarises)."""
    nodes = g.nodes
    roots = g.roots()
    groups = collections.Counter(g._root_key(nodes[s]) for s in roots)
    duplicate_roots = sum(n - 1 for n in groups.values())
    broken_roots = sum(nodes[s].break_of is not None for s in roots)
    conversations = max(0, len(roots) - broken_roots - duplicate_roots)
    breaks = sum(n.kind == "retokenized" for n in nodes.values()) + sum(
        n.break_of is not None for n in nodes.values()
    )
    tools = g.has_tools()
    return RolloutStats(
        turns=len(nodes),
        roots=len(roots),
        forks=sum(len(n.children) - 1 for n in nodes.values() if n.children) + duplicate_roots,
        breaks=breaks,
        discarded=sum(g.discarded(s) for s in nodes),
        trainable_tokens=sum(nodes[s].sampled_len for s in nodes if g.node_mask_on(s, tools=tools)),
        fragmentation=round((conversations + breaks) / max(conversations, 1), 4) if nodes else 0.0,
        conversations=conversations,
    )


def _ids(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


@st.composite
def rollouts(draw: Any) -> tuple[list[Turn], list[int], list[int | None]]:
    """Calls that extend, retry, re-tokenise, break from or ignore earlier ones, an arrival
    order, and after each arrival maybe one arrived call demoted to auxiliary (as a harness's
    trajectory does). Ids come from a tiny alphabet so twins and coincidental prefixes happen."""
    token = st.integers(1, 4)
    made: list[dict[str, Any]] = []
    for seq in range(draw(st.integers(1, 12))):
        kind = "root" if not made else draw(st.sampled_from(KINDS))
        parent = made[draw(st.integers(0, len(made) - 1))] if made else None
        if kind == "root" or parent["prompt"] is None and kind != "no_ids":
            prompt = draw(st.lists(token, min_size=1, max_size=4))
            messages = [SYSTEM, {"role": "user", "content": f"task {draw(st.integers(0, 2))}"}]
        elif kind == "retry":
            prompt, messages = parent["prompt"], parent["messages"]
        else:
            messages = [
                *parent["messages"],
                parent["response"],
                {"role": "user", "content": f"observation {seq}"},
            ]
            prompt = None
            if kind != "no_ids" and parent["prompt"] is not None:
                head, reply = list(parent["prompt"]), list(parent["sampled"])
                if kind == "retokenize":
                    reply[-1] = 5  # the reply's text renders to another last id
                elif kind == "break":
                    at = draw(st.integers(0, len(head) - 1))
                    head[at] = 6  # the history rendered differently
                prompt = head + reply + draw(st.lists(token, min_size=0, max_size=3))
        sampled = draw(st.lists(token, min_size=1, max_size=3)) if prompt is not None else None
        reply_text = draw(st.sampled_from(["ok", "ls", f"reply {seq}"]))
        made.append(
            {
                "seq": seq,
                "prompt": prompt,
                "sampled": sampled,
                "messages": messages,
                "response": {"role": "assistant", "content": reply_text},
                "tools": draw(st.booleans()),
                "auxiliary": draw(st.integers(0, 5)) == 0,
                "untrainable": draw(st.integers(0, 5)) == 0,
                "finish": draw(st.sampled_from(["stop", "stop", "length"])),
            }
        )
    turns = []
    for m in made:
        has_ids = m["prompt"] is not None
        turns.append(
            Turn(
                session_id="s",
                seq=m["seq"],
                prompt_ids=_ids(m["prompt"]) if has_ids else None,
                sampled_ids=_ids(m["sampled"]) if has_ids else None,
                logprobs=(np.full(len(m["sampled"]), -0.5) if has_ids and not m["untrainable"] else None),
                finish_reason=m["finish"],
                response=m["response"],
                request={"messages": m["messages"], **({"tools": TOOLS} if m["tools"] else {})},
                meta={"call_role": "auxiliary"} if m["auxiliary"] else {},
            )
        )
    order = draw(st.permutations(range(len(turns))))
    demotions = [draw(st.none() | st.integers(0, i)) for i in range(len(turns))]
    return turns, list(order), demotions


@pytest.mark.medium
@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(rollouts())
def test_running_stats_equal_a_full_recount_after_every_arrival(rollout):
    turns, order, demotions = rollout
    g = RolloutGraph()
    for k, i in enumerate(order):
        g.add(turns[i])
        assert g.stats() == recounted(g)
        if demotions[k] is not None:
            g.demote([turns[order[demotions[k]]].seq], "not in the trajectory")
            assert g.stats() == recounted(g)


def test_recount_sees_forks_breaks_discards_and_adoption():
    # The generator reaches what the running counts must follow: a late ancestor adopting its
    # descendants, a discarded retry, a retokenized edge and a prefix break, in one rollout.
    first = Turn(
        session_id="s",
        seq=0,
        prompt_ids=_ids([1, 2]),
        sampled_ids=_ids([3]),
        logprobs=np.full(1, -0.5),
        finish_reason="stop",
        request={"messages": [SYSTEM, {"role": "user", "content": "task 0"}]},
        response={"role": "assistant", "content": "ok"},
    )
    messages = [
        SYSTEM,
        {"role": "user", "content": "task 0"},
        first.response,
        {"role": "user", "content": "observation 1"},
    ]

    def later(seq: int, prompt: list[int], sampled: list[int]) -> Turn:
        return Turn(
            session_id="s",
            seq=seq,
            prompt_ids=_ids(prompt),
            sampled_ids=_ids(sampled),
            logprobs=np.full(len(sampled), -0.5),
            finish_reason="stop",
            request={"messages": messages},
            response={"role": "assistant", "content": "ls"},
        )

    turns = [
        first,
        later(1, [1, 2, 3, 4], [2]),
        later(2, [1, 2, 3, 4], [4]),
        later(3, [1, 2, 5, 4], [1]),
        later(4, [6, 2, 3, 4], [1]),
    ]
    g = RolloutGraph()
    for t in [turns[1], turns[2], turns[3], turns[0], turns[4]]:  # the ancestor arrives late
        g.add(t)
        assert g.stats() == recounted(g)
    st_ = g.stats()
    assert g.link(1).parent == 0 and g.link(3).kind == "retokenized" and g.nodes[4].break_of == 0
    assert st_.discarded == 0 and st_.forks == 2 and st_.breaks == 2
    g.add(later(5, [1, 2, 3, 4, 2, 7], [1]))  # turn 1 continued: its siblings are discarded now
    assert g.stats() == recounted(g) and g.stats().discarded == 2


def test_demoting_a_call_takes_its_tokens_out_of_the_running_stats():
    t = Turn(
        session_id="s",
        seq=0,
        prompt_ids=_ids([1, 2]),
        sampled_ids=_ids([3, 4]),
        logprobs=np.full(2, -0.5),
        finish_reason="stop",
        request={"messages": [SYSTEM, {"role": "user", "content": "task 0"}]},
        response={"role": "assistant", "content": "ok"},
    )
    g = RolloutGraph()
    g.add(t)
    assert g.stats().trainable_tokens == 2
    g.demote([0], "not in the trajectory")
    assert g.stats().trainable_tokens == 0 == recounted(g).trainable_tokens
    assert g.node_role(0) == "auxiliary"
