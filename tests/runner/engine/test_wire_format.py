"""The embedded engine answers in vLLM 0.32's exact wire format (compared with recorded bodies)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.same_shape import assert_same_shape
from tests.support.vllm_recordings import vllm_fixture

pytestmark = pytest.mark.slow


def _post(engine, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{engine.url}{path}", json=body, timeout=120)


def _sse_events(text: str) -> list:
    events = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


@pytest.mark.parametrize(
    "name",
    [
        "chat_basic",
        "chat_top2",
        "chat_length",
        "chat_n2",
        "chat_multiturn_1",
        "chat_multiturn_2",
        "chat_multiturn_3",
    ],
)
def test_chat_body_has_vllm_structure_and_prompt_ids(embedded_engine, name):
    rec = vllm_fixture(name)
    r = _post(embedded_engine, "/v1/chat/completions", rec["request"])
    assert r.status_code == 200, r.text
    body = r.json()
    assert_same_shape(body, rec["response"])
    # Same chat template and tokenizer as the real server: identical prompt ids.
    assert body["prompt_token_ids"] == rec["response"]["prompt_token_ids"]
    for choice in body["choices"]:
        ids, content = choice["token_ids"], choice["logprobs"]["content"]
        assert len(content) == len(ids), "one logprobs entry per generated id"
        assert body["usage"]["prompt_tokens"] == len(body["prompt_token_ids"])
        if choice["finish_reason"] == "stop":
            assert ids[-1] == 2 and content[-1]["token"] == "<|im_end|>"
            assert "<|im_end|>" not in choice["message"]["content"]
        else:
            assert choice["finish_reason"] == "length"
            assert len(ids) == rec["request"]["max_tokens"] and 2 not in ids
        k = rec["request"].get("top_logprobs", 0)
        for entry in content:
            assert entry["bytes"] == list(entry["token"].encode())
            assert len(entry["top_logprobs"]) == k
            if k:
                assert entry["top_logprobs"][0]["token"] == entry["token"]  # vLLM's order
                assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]
    assert body["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in body["choices"])
    assert "tool_calls" not in body["choices"][0]["message"]


def test_greedy_chat_matches_vllm_ids_for_a_short_answer(embedded_engine):
    rec = vllm_fixture("chat_basic")
    body = _post(embedded_engine, "/v1/chat/completions", rec["request"]).json()
    choice = body["choices"][0]
    assert choice["token_ids"] == rec["response"]["choices"][0]["token_ids"]
    assert choice["message"]["content"] == rec["response"]["choices"][0]["message"]["content"]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    assert body["usage"]["completion_tokens"] == 8


def test_without_return_token_ids_id_fields_are_null(embedded_engine):
    req = dict(vllm_fixture("chat_basic")["request"], max_tokens=3)
    del req["return_token_ids"], req["logprobs"], req["top_logprobs"]
    body = _post(embedded_engine, "/v1/chat/completions", req).json()
    assert body["prompt_token_ids"] is None
    assert body["choices"][0]["token_ids"] is None
    assert body["choices"][0]["logprobs"] is None


def test_stream_chunks_match_vllm_sequence_and_non_streaming_values(embedded_engine):
    rec = vllm_fixture("chat_stream")
    r = _post(embedded_engine, "/v1/chat/completions", rec["request"])
    assert r.status_code == 200
    assert r.headers["content-type"] == rec["content_type"]
    events = _sse_events(r.text)
    want = rec["events"]
    assert events[-1] == "[DONE]"
    first, *tokens, usage_chunk, _ = events
    assert_same_shape(first, want[0])
    for chunk in tokens[:-1]:
        assert_same_shape(chunk, want[1])
    assert_same_shape(tokens[-1], want[-3])
    assert_same_shape(usage_chunk, want[-2])
    assert len({e["id"] for e in events[:-1]}) == 1
    ids = [t for c in tokens for t in c["choices"][0]["token_ids"]]
    lps = [e for c in tokens for e in c["choices"][0]["logprobs"]["content"]]
    text = "".join(c["choices"][0]["delta"]["content"] for c in tokens)
    assert usage_chunk["usage"]["completion_tokens"] == len(ids)
    # The same request without streaming gives the same ids, logprobs and text.
    req = {k: v for k, v in rec["request"].items() if k not in ("stream", "stream_options")}
    body = _post(embedded_engine, "/v1/chat/completions", req).json()
    assert body["prompt_token_ids"] == first["prompt_token_ids"]
    assert body["choices"][0]["token_ids"] == ids
    assert body["choices"][0]["message"]["content"] == text
    assert [e["token"] for e in body["choices"][0]["logprobs"]["content"]] == [e["token"] for e in lps]
    assert [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]] == pytest.approx(
        [e["logprob"] for e in lps], abs=1e-4
    )
    assert tokens[-1]["choices"][0]["finish_reason"] == body["choices"][0]["finish_reason"]


def test_stream_without_usage_option_has_no_usage_chunk(embedded_engine):
    req = dict(vllm_fixture("chat_stream")["request"], max_tokens=3)
    del req["stream_options"]
    events = _sse_events(_post(embedded_engine, "/v1/chat/completions", req).text)
    assert events[-1] == "[DONE]"
    assert all(e["choices"] for e in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_legacy_completions_with_token_id_prompt(embedded_engine):
    rec = vllm_fixture("completions_ids")
    body = _post(embedded_engine, "/v1/completions", rec["request"]).json()
    assert_same_shape(body, rec["response"], mappings=("top_logprobs",))
    choice = body["choices"][0]
    assert choice["prompt_token_ids"] == rec["request"]["prompt"]
    assert len(choice["token_ids"]) == 8 and choice["finish_reason"] == "length"
    # Greedy: the first generated token is the same " Paris" vLLM produced.
    assert choice["token_ids"][0] == rec["response"]["choices"][0]["token_ids"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == 8
    assert "".join(lp["tokens"]) == choice["text"]
    assert [next(iter(d)) for d in lp["top_logprobs"]] == lp["tokens"]


def test_legacy_completions_with_text_prompt_equals_token_prompt(embedded_engine):
    req = dict(vllm_fixture("completions_ids")["request"], max_tokens=4)
    by_ids = _post(embedded_engine, "/v1/completions", req).json()
    by_text = _post(embedded_engine, "/v1/completions", dict(req, prompt="The capital of France is")).json()
    assert by_text["choices"][0]["prompt_token_ids"] == req["prompt"]
    assert by_text["choices"][0]["token_ids"] == by_ids["choices"][0]["token_ids"]


def test_models_and_health_have_vllm_shape(embedded_engine):
    rec = vllm_fixture("models")
    r = httpx.get(f"{embedded_engine.base_url}/models")
    assert r.status_code == 200
    assert_same_shape(r.json(), rec["models"]["response"])
    assert r.json()["data"][0]["id"] == embedded_engine.served_name == "smollm2"
    assert r.json()["data"][0]["max_model_len"] == 32768  # YaRN-stretched (test_long_context)
    h = httpx.get(f"{embedded_engine.url}/health")
    assert h.status_code == 200 and h.content == b""
    assert "content-type" not in h.headers


def test_tokenize_chat_and_text_forms(embedded_engine):
    rec = vllm_fixture("chat_basic")
    r = _post(
        embedded_engine, "/tokenize", {"model": "smollm2", "messages": rec["request"]["messages"]}
    ).json()
    assert r["tokens"] == rec["response"]["prompt_token_ids"]
    assert r["count"] == 37 and r["max_model_len"] == 32768
    r = _post(embedded_engine, "/tokenize", {"prompt": "The capital of France is"}).json()
    assert r["tokens"] == [504, 3575, 282, 4649, 314] and r["count"] == 5


@pytest.mark.parametrize(
    "name",
    [
        "tokenize_chat_gen",
        "tokenize_chat_default",
        "tokenize_chat_nogen",
        "tokenize_chat_special",
        "tokenize_chat_no_system",
        "tokenize_chat_assistant_last",
        "tokenize_chat_continue",
        "tokenize_prompt",
        *(
            f"tokenin_{tag}_tokenize_{part}"
            for tag in ("greedy", "stop", "retok")
            for part in ("full", "held", "history_gen", "history_empty")
        ),
    ],
)
def test_tokenize_answers_the_ids_vllm_answered(embedded_engine, name):
    """Every recorded vLLM `/tokenize` body without tools: the same ids and reply shape (tokens
    are the same tokenizer and template; tools are rendered into the prompt here by design)."""
    rec = vllm_fixture(name)
    r = _post(embedded_engine, "/tokenize", rec["request"]).json()
    assert r["tokens"] == rec["response"]["tokens"]
    assert_same_shape(r, rec["response"])


@pytest.mark.parametrize("tag", ["stop", "retok"])
def test_token_in_completion_has_vllms_shape(embedded_engine, tag):
    """The exact token-id completion token-in sent to vLLM (recorded): the same reply shape, the
    prompt echoed per choice. (vLLM also streams it; this engine refuses streamed legacy
    completions, which token-in never asks for.)"""
    rec = vllm_fixture(f"tokenin_{tag}_turn2_ids")
    body = _post(embedded_engine, "/v1/completions", rec["request"]).json()
    assert_same_shape(body, rec["response"], mappings=("top_logprobs",))
    assert body["choices"][0]["prompt_token_ids"] == rec["request"]["prompt"]
    assert 0 < len(body["choices"][0]["token_ids"]) <= rec["request"]["max_tokens"]


@pytest.fixture(scope="module")
def token_id_engine():
    from tapdeck.runner.engine.embedded import EmbeddedEngine

    with EmbeddedEngine(return_tokens_as_token_ids=True) as eng:
        yield eng


def test_return_tokens_as_token_ids_mode(token_id_engine):
    rec = vllm_fixture("chat_token_id_strings")
    body = _post(token_id_engine, "/v1/chat/completions", rec["request"]).json()
    assert_same_shape(body, rec["response"])
    choice = body["choices"][0]
    assert choice["message"]["content"] and "token_id" not in choice["message"]["content"]
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"]) > 0
    for entry, tid in zip(choice["logprobs"]["content"], choice["token_ids"], strict=True):
        assert entry["token"] == f"token_id:{tid}"
        assert entry["top_logprobs"][0]["token"] == f"token_id:{tid}"
        # vLLM quirk: the sampled entry's bytes are the real token's, the top entries' bytes
        # those of the "token_id:N" string.
        assert entry["top_logprobs"][0]["bytes"] == list(f"token_id:{tid}".encode())
    assert choice["logprobs"]["content"][0]["bytes"] == [84, 104, 101]  # "The"


def test_return_tokens_as_token_ids_stream(token_id_engine):
    rec = vllm_fixture("chat_token_id_strings_stream")
    events = _sse_events(_post(token_id_engine, "/v1/chat/completions", rec["request"]).text)
    assert_same_shape(events[1], rec["events"][1])
    for chunk in events[1:-2]:
        entry = chunk["choices"][0]["logprobs"]["content"][0]
        assert entry["token"] == f"token_id:{chunk['choices'][0]['token_ids'][0]}"


def test_stream_with_stop_string_holds_back_and_matches_non_streaming(embedded_engine):
    req = dict(vllm_fixture("chat_basic")["request"], stop=["Paris"])
    body = _post(embedded_engine, "/v1/chat/completions", req).json()
    events = _sse_events(_post(embedded_engine, "/v1/chat/completions", dict(req, stream=True)).text)
    chunks = [e for e in events[1:] if e != "[DONE]"]
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
    assert text == body["choices"][0]["message"]["content"] == "The capital of France is "
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"][0]["stop_reason"] == "Paris"
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == body["choices"][0]["token_ids"]


def test_unsupported_content_part_is_a_400(embedded_engine):
    req = {
        "model": "smollm2",
        "max_tokens": 2,
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    }
    r = _post(embedded_engine, "/v1/chat/completions", req)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "BadRequestError" and "image_url" in error["message"]


def test_continue_final_message_leaves_the_assistant_turn_open(embedded_engine):
    messages = [
        *vllm_fixture("chat_basic")["request"]["messages"],
        {"role": "assistant", "content": "The capital of France is"},
    ]
    body = _post(
        embedded_engine,
        "/v1/chat/completions",
        {
            "model": "smollm2",
            "messages": messages,
            "max_tokens": 2,
            "temperature": 0,
            "return_token_ids": True,
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    ).json()
    assert body["prompt_token_ids"][-5:] == [504, 3575, 282, 4649, 314]
    assert body["choices"][0]["token_ids"][0] == 7042  # " Paris"


def test_prompt_logprobs_in_vllms_shape(embedded_engine):
    """vLLM's `prompt_logprobs` on a token-id prompt: None for the first token, then per token a
    dict keyed by token id, the prompt's own token first, with `logprob`, `rank`, `decoded_token`;
    greedy continuations are rank 1 and carry the logprob the engine sampled them with."""
    req = dict(vllm_fixture("completions_ids")["request"], max_tokens=4)
    sampled = _post(embedded_engine, "/v1/completions", req).json()["choices"][0]
    ids = req["prompt"] + sampled["token_ids"]
    body = _post(
        embedded_engine,
        "/v1/completions",
        {"model": "smollm2", "prompt": ids, "max_tokens": 1, "prompt_logprobs": 2},
    ).json()
    scored = body["choices"][0]["prompt_logprobs"]
    assert scored[0] is None and len(scored) == len(ids)
    for token, entry in zip(ids[1:], scored[1:], strict=True):
        assert next(iter(entry)) == str(token)
        assert set(entry[str(token)]) == {"logprob", "rank", "decoded_token"}
        assert 1 <= len(entry) <= 3
    tail = scored[len(req["prompt"]) :]
    assert [e[str(t)]["rank"] for t, e in zip(sampled["token_ids"], tail, strict=True)] == [1] * 4
    assert [e[str(t)]["decoded_token"] for t, e in zip(sampled["token_ids"], tail, strict=True)] == (
        sampled["logprobs"]["tokens"]
    )
    got = [e[str(t)]["logprob"] for t, e in zip(sampled["token_ids"], tail, strict=True)]
    assert got == pytest.approx(sampled["logprobs"]["token_logprobs"], abs=0.05)


def test_prompt_logprobs_out_of_range_is_refused(embedded_engine):
    r = _post(
        embedded_engine, "/v1/completions", {"model": "smollm2", "prompt": [1, 2], "prompt_logprobs": 21}
    )
    assert r.status_code == 400 and "prompt_logprobs" in r.text
