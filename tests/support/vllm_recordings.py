"""The recorded vLLM 0.32 bodies (tests/fixtures/vllm, written by its record.py) and what tests
read out of them."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from tapdeck.proxy.upstream.reasoning import MarkerCache, read_markers

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"

THINK, END_THINK = 248068, 248069
"""`<think>` and `</think>` in the recorded think tokenizer (tokenize_reasoning_markers_think.json)."""

TOKENIN_TOKENIZE_PARTS = ("full", "held", "history_gen", "history_empty")
"""The four `/tokenize` calls token-in makes for a turn, as recorded (`tokenin_<tag>_tokenize_<part>`)."""


def vllm_fixture(name: str) -> dict[str, Any]:
    """A recorded vLLM exchange by file name, `.json` optional (`"chat_basic"`, `"tiny/chat_basic"`)."""
    path = FIXTURES / (name if name.endswith(".json") else f"{name}.json")
    return json.loads(path.read_text())


def vllm_reply_to(body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """A copy of a recorded reply as vLLM answers `body`: a request that asked for no logprobs gets
    no prompt ids, token ids or logprobs."""
    reply = copy.deepcopy(reply)
    if not body.get("logprobs"):
        reply.pop("prompt_token_ids", None)
        for choice in reply["choices"]:
            choice["logprobs"] = None
            choice.pop("token_ids", None)
    return reply


def vllm_error_case(case: str) -> tuple[int, dict[str, Any]]:
    """Status and body of one recorded case of errors.json (`"unknown_model"`, ...)."""
    for c in vllm_fixture("errors")["cases"]:
        if c["case"] == case:
            return c["status"], c["body"]
    raise KeyError(case)


def vllm_error(status: int, message: str, kind: str = "BadRequestError") -> dict[str, Any]:
    """An error body in vLLM's recorded envelope (errors.json)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def think_tokenizer_reply(body: dict[str, Any]) -> dict[str, Any] | None:
    """Recorded vLLM's reply to the marker probe from the think tokenizer, for a probe naming
    any model; None for any other body."""
    rec = vllm_fixture("tokenize_reasoning_markers_think")
    if {**body, "model": rec["request"]["model"]} != rec["request"]:
        return None
    return rec["response"]


def smollm2_markers() -> MarkerCache:
    """A marker cache that already holds what recorded vLLM said of SmolLM2 (no reasoning markers),
    so a planner under test asks its engine nothing for them."""
    reply = vllm_fixture("tokenize_reasoning_markers")["response"]
    return MarkerCache({("http://vllm.test/v1", "smollm2"): read_markers(reply)})
