"""A session's turns as token chains: one engine request scores a whole chain.

An agent's call k+1 usually sends call k's prompt and reply back with something appended, so its
prompt starts with every earlier turn's ids. Such turns form one chain, whose ids are its last
turn's prompt and completion: scoring that sequence once gives every turn's completion tokens their
logprobs, each conditioned on exactly the ids it was sampled after. A turn whose prompt does not
start with a chain's ids (a retry, a branch, a re-rendered history) starts a chain of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from tapdeck.proxy.capture.turn import Turn


@dataclass
class ChainTurn:
    """One turn's completion inside its chain: `ids[start : start + size]`."""

    seq: int
    start: int
    size: int


@dataclass
class Chain:
    """Token ids (the last turn's prompt + completion) and the turns whose completions lie in it."""

    ids: np.ndarray
    turns: list[ChainTurn] = field(default_factory=list)


def token_chains(turns: Iterable[Turn]) -> list[Chain]:
    """The chains of the turns that hold token ids (with a non-empty prompt), in arrival order."""
    chains: list[Chain] = []
    for turn in turns:
        if turn.prompt_ids is None or turn.sampled_ids is None or not turn.prompt_ids.size:
            continue
        prompt, sampled = turn.prompt_ids, turn.sampled_ids
        entry = ChainTurn(turn.seq, int(prompt.size), int(sampled.size))
        ids = np.concatenate([prompt, sampled])
        for chain in reversed(chains):  # the latest chain is the likeliest to continue
            n = chain.ids.size
            if n <= prompt.size and np.array_equal(prompt[:n], chain.ids):
                chain.ids = ids
                chain.turns.append(entry)
                break
        else:
            chains.append(Chain(ids, [entry]))
    return chains
