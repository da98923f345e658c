"""Small rollout documents for view tests: only the fields a test is about, the rest as the server
fills them for a plain turn."""

from __future__ import annotations

from typing import Any

from tapdeck.schema.sessions import RolloutDocument

_TURN = {"link_kind": "prefix", "capture_mode": "text", "role": "agent", "discarded": False,
         "trainable": True, "prompt_len": 10, "sampled_len": 4, "finish_reason": "stop",
         "request": {}, "response": {}, "sampling": {}, "meta": {}, "created_at": 0.0,
         "findings": []}


def rollout_doc(turns: list[dict[str, Any]]) -> RolloutDocument:
    """A RolloutDocument whose turns are `turns` over the defaults (a root's kind is `root`)."""
    full = [{**_TURN, **({"link_kind": "root"} if t.get("parent") is None else {}), **t} for t in turns]
    return RolloutDocument.model_validate({
        "schema_version": 1, "session_id": "s1", "tier": "tokens", "rollout_type": "train",
        "ok": True, "reward": None, "metadata": {}, "stats": {}, "paths": [], "sequences": [],
        "turns": full, "findings": []})
