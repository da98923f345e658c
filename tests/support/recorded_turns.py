"""Turns built from the recorded vLLM bodies (tests/fixtures/vllm), exactly as the engine sent them."""

from __future__ import annotations

import numpy as np

from tapdeck.proxy.capture.turn import Turn
from tests.support.vllm_recordings import vllm_fixture


def turn_from_fixture(
    name: str, seq: int, session_id: str = "s1", *, ids: bool = True, request: dict | None = None
) -> Turn:
    """A Turn from a recorded chat exchange: request messages from `request`, ids from `response`."""
    body = vllm_fixture(name)
    resp = body["response"]
    choice = resp["choices"][0]
    content = choice["logprobs"]["content"] if choice.get("logprobs") else None
    req = (
        request
        if request is not None
        else {k: v for k, v in body["request"].items() if k in ("messages", "tools", "model")}
    )
    return Turn(
        session_id=session_id,
        seq=seq,
        prompt_ids=np.asarray(resp["prompt_token_ids"], dtype=np.int32) if ids else None,
        sampled_ids=np.asarray(choice["token_ids"], dtype=np.int32) if ids else None,
        logprobs=np.asarray([c["logprob"] for c in content], dtype=np.float64) if content else None,
        finish_reason=choice["finish_reason"],
        request=req,
        response=choice["message"],
        sampling={
            "submitted": {k: body["request"].get(k) for k in ("temperature", "max_tokens")},
            "requested": {},
        },
        token_texts=[c["token"] for c in content] if content else None,
        meta={"dialect": "chat", "usage": resp.get("usage")},
        created_at=float(resp.get("created", 0)),
    )
