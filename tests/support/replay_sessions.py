"""Stored sessions to replay, and a reference scorer for the fake vLLM with known drift: a three-turn
chain from the recorded vLLM conversation (tests/fixtures/vllm/chat_multiturn_*), whose reference
logprobs are the sampler's plus OFF, except SPIKE's token."""

from __future__ import annotations

from collections.abc import Callable

from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.capture.turn import Turn
from tapdeck.proxy.store.database import Store
from tests.support.recorded_turns import turn_from_fixture

CHAIN = ("chat_multiturn_1", "chat_multiturn_2", "chat_multiturn_3")
OFF = 0.1
"""The fake reference's logprob of every sampled token: the sampler's plus OFF ..."""
SPIKE = (1, 4, 2.0)
"""... except this one (turn seq, token index), off by 2 nats."""


def store_session(store: Store, session_id: str, turns: list[Turn], tier: str = "tokens") -> None:
    """Store `turns` as one session's captured calls."""
    store.create_session({"id": session_id, "tier": tier, "rollout_type": "train"})
    graph = RolloutGraph()
    for turn in turns:
        store.append_turn(turn, graph.add(turn))


def chain_turns(session_id: str = "s-a") -> list[Turn]:
    """The recorded three-turn conversation: each prompt holds the turns before it (one chain)."""
    return [turn_from_fixture(name, seq, session_id) for seq, name in enumerate(CHAIN)]


def reference_scores(
    turns: list[Turn], *, text_of: Callable[[str], str] | None = None
) -> Callable[[list[int]], list[tuple[float, str]]]:
    """A `FakeVllm(prompt_scores=...)` scorer for `turns`' chain: at each sampled token's position
    the sampler's logprob + OFF (SPIKE's + 2), -1.0 elsewhere, with the captured token texts
    (passed through `text_of`: a reference whose tokenizer differs)."""
    by_pos: dict[int, tuple[float, str]] = {}
    for turn in turns:
        assert turn.prompt_ids is not None and turn.logprobs is not None and turn.token_texts is not None
        start = turn.prompt_ids.size
        for i, (lp, text) in enumerate(zip(turn.logprobs, turn.token_texts, strict=True)):
            off = SPIKE[2] if (turn.seq, i) == SPIKE[:2] else OFF
            by_pos[start + i] = (float(lp) + off, text if text_of is None else text_of(text))

    def scores(ids: list[int]) -> list[tuple[float, str]]:
        return [by_pos.get(pos, (-1.0, "x")) for pos in range(1, len(ids))]

    return scores
