"""Turn headers for view tests: only the fields a test is about, the rest as the server fills them
for a plain turn (`GET /admin/sessions/{id}/graph`)."""

from __future__ import annotations

from typing import Any

from tapdeck.schema.sessions import GraphTurn

_TURN = {
    "link_kind": "prefix",
    "capture_mode": "text",
    "role": "agent",
    "token_in": None,
    "prompt_len": 10,
    "sampled_len": 4,
    "finish_reason": "stop",
    "created_at": 0.0,
    "findings": [],
}


def graph_turns(turns: list[dict[str, Any]]) -> list[GraphTurn]:
    """GraphTurns over the defaults (a turn without a parent is a `root`)."""
    return [
        GraphTurn.model_validate({**_TURN, **({"link_kind": "root"} if t.get("parent") is None else {}), **t})
        for t in turns
    ]
