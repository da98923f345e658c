"""capture-cases A: what goes upstream. Each request is sent to the recorded-vLLM upstream, whose
refusals are real vLLM's (tests/fixtures/vllm/errors.json), so a missed rewrite fails the call."""

from __future__ import annotations

import copy

import pytest

from tapdeck.proxy.dialects.base import DialectError
from tapdeck.proxy.upstream.client import EngineClient, EngineError, prepare_request
from tapdeck.proxy.upstream.tiers import EngineSpec, Tier

SPEC = EngineSpec(url="http://vllm.test:8111/v1")


def client_for(inprocess_vllm, **kw) -> EngineClient:
    return EngineClient(SPEC, http=inprocess_vllm.client(), **kw)


TOOL = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}


async def test_empty_tools_dropped_with_orphaned_tool_choice(inprocess_vllm, basic_chat):
    chat = {**basic_chat, "tools": [], "functions": [], "tool_choice": "auto", "parallel_tool_calls": False}
    client = client_for(inprocess_vllm)
    body, _ = client.prepare(chat, Tier.TOKENS, "smollm2", training=False)
    for key in ("tools", "functions", "tool_choice", "parallel_tool_calls"):
        assert key not in body
    reply = await client.complete(body)
    assert reply["choices"][0]["message"]["content"] == "The capital of France is Paris."


async def test_empty_tools_sent_unchanged_is_refused_by_recorded_vllm(inprocess_vllm, basic_chat):
    # The reason for the rule above: real vLLM answers 400 for `tools: []`.
    with pytest.raises(EngineError) as err:
        await client_for(inprocess_vllm).complete({**basic_chat, "tools": []})
    assert err.value.status == 400 and "must not be an empty array" in err.value.message
    assert err.value.param == "tools"  # vLLM's own `param`: what the caller's error envelope names


def test_non_empty_tools_untouched_and_absent_keys_never_added(basic_chat):
    chat = {**basic_chat, "tools": [TOOL], "tool_choice": "auto", "parallel_tool_calls": True}
    body, _ = prepare_request(chat, Tier.TOKENS, "smollm2", False)
    assert body["tools"] == [TOOL] and body["tool_choice"] == "auto" and body["parallel_tool_calls"] is True
    plain, _ = prepare_request(basic_chat, Tier.TOKENS, "smollm2", False)
    for key in ("tools", "functions", "tool_choice", "parallel_tool_calls"):
        assert key not in plain


async def test_stream_request_goes_upstream_unstreamed_without_stream_options(inprocess_vllm, basic_chat):
    chat = {**basic_chat, "stream": True, "stream_options": {"include_usage": True}}
    client = client_for(inprocess_vllm)
    body, _ = client.prepare(chat, Tier.TOKENS, "smollm2", training=False)
    assert body["stream"] is False and "stream_options" not in body
    await client.complete(body)
    assert inprocess_vllm.requests[-1]["stream"] is False


@pytest.mark.parametrize("given", [{}, {"top_logprobs": None}, {"logprobs": False, "top_logprobs": None}])
async def test_tokens_tier_forces_capture_fields(inprocess_vllm, basic_chat, given):
    client = client_for(inprocess_vllm)
    body, _ = client.prepare({**basic_chat, **given}, Tier.TOKENS, "smollm2", training=False)
    assert body["top_logprobs"] == 0 and body["logprobs"] is True and body["return_token_ids"] is True
    await client.complete(body)  # accepted by the recorded vLLM rules


def test_harness_top_logprobs_kept_and_logprobs_tier_forces_too(basic_chat):
    body, _ = prepare_request({**basic_chat, "top_logprobs": 3}, Tier.LOGPROBS, "smollm2", False)
    assert body["top_logprobs"] == 3 and body["logprobs"] is True


@pytest.mark.parametrize(("asked", "sent"), [(None, 5), (0, 5), (2, 5), (8, 8), ("x", "x")])
def test_calls_ask_the_engine_for_at_least_the_probed_alternatives(basic_chat, asked, sent):
    body, _ = prepare_request(
        {**basic_chat, "top_logprobs": asked}, Tier.TOKENS, "smollm2", False, alternatives=5
    )
    assert body["top_logprobs"] == sent  # a bad value is the engine's to refuse, in its words


async def test_text_tier_adds_no_capture_fields(inprocess_vllm, basic_chat):
    client = client_for(inprocess_vllm)
    body, _ = client.prepare({**basic_chat, "top_logprobs": None}, Tier.TEXT, "smollm2", training=False)
    assert "return_token_ids" not in body and "logprobs" not in body
    assert body["top_logprobs"] is None  # harness's own value, untouched


def test_reasoning_content_sent_as_reasoning_without_mutating(basic_chat):
    messages = [
        *basic_chat["messages"],
        {"role": "assistant", "content": "Paris.", "reasoning_content": "France → Paris"},
        {"role": "user", "content": "And Spain?"},
    ]
    chat = {**basic_chat, "messages": messages}
    before = copy.deepcopy(chat)
    body, _ = prepare_request(chat, Tier.TOKENS, "smollm2", False)
    sent = body["messages"][2]
    assert sent["reasoning"] == "France → Paris" and "reasoning_content" not in sent
    assert chat == before


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_above_cap_lowered(basic_chat, key):
    body, sampling = prepare_request({**basic_chat, key: 64000}, Tier.TOKENS, "smollm2", False)
    assert body[key] == 8192
    assert sampling["requested"][key] == 64000 and sampling["submitted"][key] == 8192


def test_max_tokens_cap_added_when_none_given(basic_chat):
    chat = {k: v for k, v in basic_chat.items() if k != "max_tokens"}
    body, _ = prepare_request(chat, Tier.TOKENS, "smollm2", False)
    assert body["max_tokens"] == 8192
    small, _ = prepare_request(basic_chat, Tier.TOKENS, "smollm2", False)
    assert small["max_tokens"] == 24


async def test_cap_follows_probed_max_model_len(inprocess_vllm, basic_chat):
    # Recorded vLLM refuses max_tokens > max_model_len (2048) with a 400.
    client = client_for(inprocess_vllm, max_model_len=2048)
    body, _ = client.prepare({**basic_chat, "max_tokens": 64000}, Tier.TOKENS, "smollm2", training=False)
    assert body["max_tokens"] == 2048
    await client.complete(body)


async def test_model_rewritten_to_served_name(inprocess_vllm, basic_chat):
    client = client_for(inprocess_vllm)
    body, _ = client.prepare(
        {**basic_chat, "model": "openai/gpt-5-mangled"}, Tier.TOKENS, "smollm2", training=False
    )
    assert body["model"] == "smollm2"
    await client.complete(body)  # the recorded server 404s any other name


@pytest.mark.parametrize("n", [2, 5, "2", 1.5])
def test_n_above_one_refused_with_400(basic_chat, n):
    with pytest.raises(DialectError) as err:
        prepare_request({**basic_chat, "n": n}, Tier.TOKENS, "smollm2", False)
    assert err.value.status == 400 and err.value.param == "n"


def test_n_two_really_returns_two_choices_on_vllm(vllm):
    # Why n>1 is refused rather than forwarded: vLLM answers 200 with two choices, one capture each.
    rec = vllm("chat_n2")
    assert rec["status"] == 200 and len(rec["response"]["choices"]) == 2


def test_training_tier_resets_truncating_knobs_and_keeps_requested(basic_chat):
    knobs = {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "frequency_penalty": 0.5,
        "presence_penalty": 0.3,
        "repetition_penalty": 1.1,
    }
    chat = {**basic_chat, **knobs}
    before = copy.deepcopy(chat)
    body, sampling = prepare_request(chat, Tier.TOKENS, "smollm2", True)
    assert body["top_p"] == 1.0 and body["top_k"] == -1 and body["min_p"] == 0.0
    assert body["frequency_penalty"] == 0.0 and body["presence_penalty"] == 0.0
    assert body["repetition_penalty"] == 1.0
    assert body["temperature"] == 0.7
    assert {k: sampling["requested"][k] for k in knobs} == knobs
    assert sampling["submitted"]["top_k"] == -1 and sampling["submitted"]["temperature"] == 0.7
    assert chat == before


def test_training_policy_temperature_is_sent_and_the_harness_request_recorded(basic_chat):
    chat = {**basic_chat, "temperature": 0.7, "top_p": 0.9}
    body, sampling = prepare_request(chat, Tier.TOKENS, "smollm2", True, policy={"temperature": 1.0})
    assert body["temperature"] == 1.0 and body["top_p"] == 1.0
    assert sampling["requested"]["temperature"] == 0.7 and sampling["submitted"]["temperature"] == 1.0
    eval_body, _ = prepare_request(chat, Tier.TOKENS, "smollm2", False, policy={"temperature": 1.0})
    assert eval_body["temperature"] == 0.7  # an eval session samples as its harness asks


def test_training_tier_sends_temperature_one_when_neither_harness_nor_policy_sets_it(basic_chat):
    chat = {k: v for k, v in basic_chat.items() if k != "temperature"}
    body, sampling = prepare_request(chat, Tier.TOKENS, "smollm2", True)
    assert body["temperature"] == 1.0 and sampling["submitted"]["temperature"] == 1.0
    assert "temperature" not in sampling["requested"]
    eval_body, eval_sampling = prepare_request(chat, Tier.TOKENS, "smollm2", False)
    assert "temperature" not in eval_body and "temperature" not in eval_sampling["submitted"]


@pytest.mark.parametrize(
    "policy",
    [
        {"temperature": 0},
        {"temperature": float("inf")},
        {"top_p": 0.9},
        {"temperature": 1.0, "seed": 3},
        {"temperature": True},
    ],
)
def test_training_policy_must_be_full_vocabulary(policy):
    from pydantic import ValidationError

    from tapdeck.proxy.sessions.spec import SessionSpec

    with pytest.raises(ValidationError, match="training_sampling"):
        SessionSpec(training_sampling=policy)
    trl_policy = {
        "temperature": 0.8,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "repetition_penalty": 1.0,
    }
    assert SessionSpec(training_sampling=trl_policy).training_sampling == trl_policy
    assert SessionSpec(training_sampling={"temperature": 1, "top_k": 0}).training_sampling == {
        "temperature": 1.0,
        "top_k": -1,
    }


def test_eval_call_keeps_harness_knobs(basic_chat):
    body, _ = prepare_request({**basic_chat, "top_p": 0.9}, Tier.TOKENS, "smollm2", False)
    assert body["top_p"] == 0.9


@pytest.mark.parametrize(
    "extra",
    [
        {"logit_bias": {"504": 5}},
        {"guided_json": {"type": "object"}},
        {"guided_regex": "a+"},
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
        {"tools": [TOOL], "tool_choice": "required"},
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "ls"}}},
    ],
)
def test_training_tier_refuses_constrained_decoding(basic_chat, extra):
    with pytest.raises(DialectError) as err:
        prepare_request({**basic_chat, **extra}, Tier.TOKENS, "smollm2", True)
    assert err.value.status == 400 and err.value.param in extra


@pytest.mark.parametrize(
    "extra", [{"response_format": {"type": "text"}}, {"tools": [TOOL], "tool_choice": "auto"}]
)
def test_training_tier_allows_unconstrained_settings(basic_chat, extra):
    body, _ = prepare_request({**basic_chat, **extra}, Tier.TOKENS, "smollm2", True)
    assert body["top_p"] == 1.0
