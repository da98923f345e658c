"""A token-in session on a reasoning model whose reasoning parser is not named here, through the
capture service: the engine is asked once whether the model has reasoning markers, every call goes
by text with the reason, the session gets one finding naming the flag, and a reply whose sampled
ids hold a think block gets a turn finding.

The engine is a loopback server answering with recorded vLLM 0.32 bodies: chat_basic, and the
marker probe as vLLM answered it for a tokenizer with think tokens
(tokenize_reasoning_markers_think.json). The chat reply's sampled ids are edited to hold the
think tokens, since no model with think tokens could be run here.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tapdeck.proxy.upstream.tiers import EngineSpec
from tests.support.capture_server import CaptureServer, capture_server
from tests.support.fake_vllm import FakeVllm
from tests.support.vllm_recordings import END_THINK, THINK, think_tokenizer_reply, vllm_fixture


@pytest.fixture
def think_engine(tmp_path: Path) -> Iterator[tuple[FakeVllm, CaptureServer]]:
    """The fake vLLM answering `/tokenize` as the think tokenizer, and a capture server on it."""
    with (
        FakeVllm(tokenize=think_tokenizer_reply) as up,
        capture_server(EngineSpec(url=up.base_url), tmp_path, keepalive_s=0.3) as capture,
    ):
        yield up, capture


def _thinking_reply(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """chat_basic with its first and third sampled ids turned into `<think>` and `</think>`."""
    reply = copy.deepcopy(vllm_fixture("chat_basic")["response"])
    ids = reply["choices"][0]["token_ids"]
    ids[0], ids[2] = THINK, END_THINK
    return 200, reply


def test_reasoning_model_without_a_parser_is_named_once_and_its_calls_go_by_text(think_engine):
    up, capture = think_engine
    info = capture.admin.post("/admin/sessions", json={"rollout_type": "train", "token_in": True})
    info.raise_for_status()
    sid, key = info.json()["id"], info.json()["api_key"]
    messages = copy.deepcopy(vllm_fixture("chat_basic")["request"]["messages"])
    for k in range(2):
        up.answer = _thinking_reply if k == 1 else "chat_basic"
        r = httpx.post(
            f"{capture.url}/v1/chat/completions",
            timeout=60,
            headers={"Authorization": f"Bearer {key}"},
            json={"model": "smollm2", "messages": messages, "max_tokens": 24},
        )
        assert r.status_code == 200, r.text
        messages += [
            {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
            {"role": "user", "content": "And Italy?"},
        ]

    turns = [capture.turn(sid, seq) for seq in range(2)]
    assert [t["meta"]["capture_mode"]["reason"] for t in turns] == ["reasoning_unparsed"] * 2
    session = [f for f in capture.summary(sid)["findings"] if f["code"] == "reasoning_unparsed"]
    assert len(session) == 1 and session[0]["level"] == "WARN"
    assert "--engine-reasoning-parser" in session[0]["detail"]
    codes = [[f["code"] for f in t["findings"]] for t in turns]
    assert "reasoning_in_content" not in codes[0] and "reasoning_in_content" in codes[1]
    tokenized = [s.body for s in up.sent if s.path == "/tokenize"]
    assert [b.get("return_token_strs") for b in tokenized] == [True]  # one probe, no renders
    graph = capture.admin.get(f"/admin/sessions/{sid}/graph").json()
    assert any(f["code"] == "reasoning_unparsed" for f in graph["findings"])
