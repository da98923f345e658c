"""A small exported run built from recorded vLLM turns, and the advantages a GRPO trainer would give it."""

from __future__ import annotations

from pathlib import Path

from tapdeck.proxy.capture.export import trace_rows, training_trace, write_jsonl
from tapdeck.proxy.capture.graph import RolloutGraph
from tests.support.recorded_turns import turn_from_fixture

# rollout id → (group id, reward, recorded vLLM exchanges in call order)
ROLLOUTS: dict[str, tuple[str, float | None, list[str]]] = {
    "ro-a": ("0", 1.0, ["chat_multiturn_1", "chat_multiturn_2", "chat_multiturn_3"]),
    "ro-b": ("0", 0.0, ["chat_basic"]),
    "ro-c": ("0", None, ["chat_multiturn_trunc_1", "chat_multiturn_trunc_2"]),
    "ro-d": ("1", None, ["chat_multiturn_1"]),
    "ro-e": ("2", 0.5, ["chat_multiturn_retok_1", "chat_multiturn_retok_2"]),
    "ro-f": ("2", 0.5, ["chat_length"]),
}

STD = 0.5  # population std of {1, 0}, as TRL's AsyncGRPO takes it (test_data_check_equals_trl checks TRL)
# Expected per group, by rollout id order among valid rollouts: (r - mean) / (std + 1e-8); null excluded.
EXPECTED_ADVANTAGES = {
    "0": [0.5 / (STD + 1e-8), -0.5 / (STD + 1e-8), None],
    "1": [None],
    "2": [0.0, 0.0],
}


def _captured(rollout_id: str) -> tuple[dict, RolloutGraph]:
    session_id = f"s-{rollout_id}"
    graph = RolloutGraph()
    for seq, name in enumerate(ROLLOUTS[rollout_id][2]):
        graph.add(turn_from_fixture(name, seq, session_id))
    return {"id": session_id, "rollout_type": "train", "metadata": {}}, graph


def rollout_rows(rollout_id: str) -> list[dict]:
    """The export rows of one rollout (its own session), as `tapdeck export RUN` writes them."""
    group, reward, _ = ROLLOUTS[rollout_id]
    session, graph = _captured(rollout_id)
    return trace_rows(session, graph, "tokens", group_id=group, rollout_id=rollout_id, reward=reward)


def rollout_trace(rollout_id: str) -> dict:
    """The training trace of one rollout, as `GET /admin/sessions/{id}/trace` returns it."""
    session, graph = _captured(rollout_id)
    return training_trace(session, graph, "tokens")


def write_export(path: Path) -> Path:
    """All ROLLOUTS as one JSONL export."""
    rows = [row for rid in ROLLOUTS for row in rollout_rows(rid)]
    return write_jsonl(path, rows)


TOOL_CALLS = [
    {"id": "c1", "name": "shell", "arguments": {"cmd": "ls"}},
    {"id": "c2", "name": "shell", "arguments": {"cmd": "cat notes.txt"}},
    {"id": "c3", "name": "write_file", "arguments": {"path": "a", "text": "b"}},
]


def tool_call_trace() -> dict:
    """A recorded turn whose reply is given tool calls as a dialect records them (flat), as a trace."""
    turn = turn_from_fixture("chat_basic", 0, "s-tools")
    turn.response = {"role": "assistant", "content": None, "tool_calls": TOOL_CALLS}
    graph = RolloutGraph()
    graph.add(turn)
    return training_trace({"id": "s-tools", "rollout_type": "train", "metadata": {}}, graph, "tokens")
