"""Wire fidelity against the embedded engine (SmolLM2-135M, its real ChatML template): what the
engine is asked to render is what the caller's API means."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tapdeck.proxy.upstream.tiers import EngineSpec
from tests.support.capture_server import CaptureServer, capture_server

pytestmark = pytest.mark.slow

GENERATION_PROMPT = [1, 520, 9531, 198]
"""`<|im_start|>assistant\\n` in SmolLM2's tokenizer (shared/fixtures/vllm/README.md)."""


@pytest.fixture(scope="module")
def proxy(embedded_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CaptureServer]:
    engine = EngineSpec(url=embedded_engine.base_url, model=embedded_engine.served_name)
    with capture_server(engine, tmp_path_factory.mktemp("capture"), keepalive_s=10.0) as server:
        yield server


def test_anthropic_prefill_is_continued_not_answered_after(proxy: CaptureServer) -> None:
    info = proxy.open_session()
    client = anthropic.Anthropic(
        api_key=info["api_key"], base_url=info["base_urls"]["anthropic"], max_retries=0
    )
    question = {"role": "user", "content": "What is the capital of France?"}
    prefill = "The capital of France is"
    for messages in ([question], [question, {"role": "assistant", "content": prefill}]):
        message = client.messages.create(
            model="claude-x", max_tokens=4, messages=messages, extra_body={"temperature": 0}
        )
        assert message.content and message.content[0].type == "text"
    assert proxy.store is not None
    plain, prefilled = (t.prompt_ids.tolist() for t in proxy.store.load_session(info["id"])[1])
    # The prefill's prompt is the question's, then the prefill's own tokens, left open: no end of
    # the assistant turn and no second assistant header after it.
    assert plain[-len(GENERATION_PROMPT) :] == GENERATION_PROMPT
    assert prefilled[: len(plain)] == plain and len(prefilled) > len(plain)
    assert 2 not in prefilled[len(plain) :]
    assert prefilled[-len(GENERATION_PROMPT) :] != GENERATION_PROMPT


def test_a_prefill_after_a_held_turn_goes_as_text_so_it_stays_open(proxy: CaptureServer) -> None:
    # Its history extends turn 0 exactly (token-in would take it), but held ids would close the
    # prefill: the call goes as text, which the engine renders open.
    info = proxy.open_session()
    client = anthropic.Anthropic(
        api_key=info["api_key"], base_url=info["base_urls"]["anthropic"], max_retries=0
    )
    question = {"role": "user", "content": "What is the capital of France?"}
    first = client.messages.create(
        model="claude-x", max_tokens=4, messages=[question], extra_body={"temperature": 0}
    )
    prefill = "The capital of Spain is"
    client.messages.create(
        model="claude-x",
        max_tokens=4,
        extra_body={"temperature": 0},
        messages=[
            question,
            {"role": "assistant", "content": first.content[0].text},
            {"role": "user", "content": "And of Spain?"},
            {"role": "assistant", "content": prefill},
        ],
    )
    turn = proxy.turn(info["id"], 1)
    assert turn["meta"]["capture_mode"]["reason"] == "continue_final_message"
    assert proxy.store is not None
    prompt = proxy.store.load_session(info["id"])[1][1].prompt_ids.tolist()
    assert prompt[-len(GENERATION_PROMPT) :] != GENERATION_PROMPT and prompt[-1] != 2
