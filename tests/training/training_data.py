"""A small exported run built from recorded vLLM turns, and the advantages a GRPO trainer would give it."""

from __future__ import annotations

import math
from pathlib import Path

from proxy_core_fixtures import turn_from_fixture

from tapdeck.proxy.export import trace_rows, write_jsonl
from tapdeck.proxy.graph import RolloutGraph

# rollout id → (group id, reward, recorded vLLM exchanges in call order)
ROLLOUTS: dict[str, tuple[str, float | None, list[str]]] = {
    "ro-a": ("0", 1.0, ["chat_multiturn_1", "chat_multiturn_2", "chat_multiturn_3"]),
    "ro-b": ("0", 0.0, ["chat_basic"]),
    "ro-c": ("0", None, ["chat_multiturn_trunc_1", "chat_multiturn_trunc_2"]),
    "ro-d": ("1", None, ["chat_multiturn_1"]),
    "ro-e": ("2", 0.5, ["chat_multiturn_retok_1", "chat_multiturn_retok_2"]),
    "ro-f": ("2", 0.5, ["chat_length"]),
}

SQRT_HALF = math.sqrt(0.5)  # sample std of {1, 0}
# Expected per group, by rollout id order among valid rollouts: (r - mean) / (std + 1e-8); null excluded.
EXPECTED_ADVANTAGES = {
    "0": [0.5 / (SQRT_HALF + 1e-8), -0.5 / (SQRT_HALF + 1e-8), None],
    "1": [None],
    "2": [0.0, 0.0],
}


def rollout_rows(rollout_id: str) -> list[dict]:
    """The export rows of one rollout (its own session), as `tapdeck export RUN` writes them."""
    group, reward, names = ROLLOUTS[rollout_id]
    session_id = f"s-{rollout_id}"
    graph = RolloutGraph()
    for seq, name in enumerate(names):
        graph.add(turn_from_fixture(name, seq, session_id))
    session = {"id": session_id, "rollout_type": "train", "metadata": {}}
    return trace_rows(session, graph, "tokens", group_id=group, rollout_id=rollout_id, reward=reward)


def write_export(path: Path) -> Path:
    """All ROLLOUTS as one JSONL export."""
    rows = [row for rid in ROLLOUTS for row in rollout_rows(rid)]
    return write_jsonl(path, rows)
