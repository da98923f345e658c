"""The token-prefix property across calls of one conversation, and exactly where it breaks.

Call k+1 extends call k's messages with the returned assistant content verbatim plus a new user
message. Its prompt ids start with call k's prompt ids + sampled ids when:
* the reply ended with the EOS (`<|im_end|>` is then both sampled and what the template writes);
* the sampled ids are the canonical tokenisation of the reply's text.
It breaks (and the tests pin how) when a turn is cut by `length` (the template adds an `<|im_end|>`
the model never sampled) or when a sampled reply re-tokenises to other ids.

The seeds below were found on the served F16 file at the unstretched context (8,192 tokens): the
default engine's YaRN-stretched 32k context, or another model file, changes the logits slightly,
and with them what a seed samples.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.vllm_recordings import vllm_fixture

pytestmark = pytest.mark.slow

IM_END, NEWLINE, IM_START, USER = 2, 198, 1, 4093
OBSERVATIONS = ["Output of `ls`:\nfoo.txt\nbar.py", "Output of `cat foo.txt`:\nhello world"]


@pytest.fixture(scope="module")
def embedded_engine() -> Iterator[Any]:
    """The embedded engine at SmolLM2's trained context (no RoPE stretch), for this module."""
    pytest.importorskip("llama_cpp", reason="the embedded engine needs llama-cpp-python")
    from tapdeck.runner.engine.embedded import EmbeddedEngine

    engine = EmbeddedEngine(n_ctx=8192).start()
    try:
        yield engine
    finally:
        engine.stop()


def _chat(engine, messages, **kw) -> dict:
    body = {
        "model": "smollm2",
        "messages": messages,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 0,
        **kw,
    }
    r = httpx.post(f"{engine.base_url}/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _tokenize(engine, text: str) -> list[int]:
    return httpx.post(f"{engine.url}/tokenize", json={"prompt": text}).json()["tokens"]


def test_greedy_conversation_keeps_the_exact_prefix(embedded_engine):
    messages = list(vllm_fixture("chat_multiturn_1")["request"]["messages"])
    prev = None
    for k in range(3):
        body = _chat(embedded_engine, messages, temperature=0, max_tokens=32)
        prompt, choice = body["prompt_token_ids"], body["choices"][0]
        # Greedy, each reply ends on the EOS well within 32 tokens: the case this test is about
        # (a length cut is test_length_cut_turn_gets_an_im_end_never_sampled's).
        assert choice["finish_reason"] == "stop" and choice["token_ids"][-1] == IM_END, choice
        if prev is not None:
            prev_prompt, prev_ids = prev
            full = prev_prompt + prev_ids
            assert prompt[: len(full)] == full
            # the template's own tokens follow the sampled EOS
            assert prompt[len(full) : len(full) + 4] == [NEWLINE, IM_START, USER, NEWLINE]
        prev = (prompt, choice["token_ids"])
        messages += [
            {"role": "assistant", "content": choice["message"]["content"]},
            {"role": "user", "content": OBSERVATIONS[k % 2]},
        ]


def test_length_cut_turn_gets_an_im_end_never_sampled(embedded_engine):
    messages = list(vllm_fixture("chat_multiturn_1")["request"]["messages"])
    first = _chat(embedded_engine, messages, temperature=1.0, seed=0, max_tokens=6)
    choice = first["choices"][0]
    assert choice["finish_reason"] == "length" and IM_END not in choice["token_ids"]
    messages += [
        {"role": "assistant", "content": choice["message"]["content"]},
        {"role": "user", "content": OBSERVATIONS[0]},
    ]
    second = _chat(embedded_engine, messages, temperature=0, max_tokens=1)
    full = first["prompt_token_ids"] + choice["token_ids"]
    # (seed 0's reply is its own canonical tokenisation, so only the cut is at play here)
    assert _tokenize(embedded_engine, choice["message"]["content"]) == choice["token_ids"]
    assert second["prompt_token_ids"][: len(full)] == full
    # the end token the template adds, which the model never sampled, then the next turn
    assert second["prompt_token_ids"][len(full) : len(full) + 5] == [IM_END, NEWLINE, IM_START, USER, NEWLINE]


def _break_offset(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None


def test_every_sampled_prefix_break_has_a_known_cause(embedded_engine):
    """At T=1 the prompt prefix always holds; prompt+reply holds unless the reply's text
    re-tokenises to other ids, and a length cut adds one template `<|im_end|>` after the reply."""
    base = list(vllm_fixture("chat_multiturn_1")["request"]["messages"])
    outcomes = {"exact": 0, "retokenized": 0}
    # seed 14 samples " list"+"ing" where the text re-tokenises as " listing"
    for seed in (0, 1, 2, 3, 14):
        first = _chat(embedded_engine, base, temperature=1.0, seed=seed, max_tokens=12)
        choice = first["choices"][0]
        messages = base + [
            {"role": "assistant", "content": choice["message"]["content"]},
            {"role": "user", "content": OBSERVATIONS[0]},
        ]
        second = httpx.post(f"{embedded_engine.url}/tokenize", json={"messages": messages}).json()["tokens"]
        prompt, ids = first["prompt_token_ids"], choice["token_ids"]
        assert second[: len(prompt)] == prompt  # holds in every case
        off = _break_offset(second[len(prompt) :], ids)
        canonical = _tokenize(embedded_engine, choice["message"]["content"])
        reply_ids = [t for t in ids if t != IM_END]
        if off is None:
            outcomes["exact"] += 1
            nxt = second[len(prompt) + len(ids)]
            assert nxt == (NEWLINE if choice["finish_reason"] == "stop" else IM_END)
        else:
            outcomes["retokenized"] += 1
            assert canonical != reply_ids, "a break must come from a re-tokenisation"
            assert off == _break_offset(canonical, reply_ids)
    assert outcomes["exact"] >= 1 and outcomes["retokenized"] >= 1, outcomes


def test_retokenised_reply_breaks_at_the_recorded_offset(embedded_engine):
    base = list(vllm_fixture("chat_multiturn_1")["request"]["messages"])
    first = _chat(embedded_engine, base, temperature=1.0, seed=14, max_tokens=12)
    choice = first["choices"][0]
    assert choice["message"]["content"].startswith("Here is the command for listing files")
    messages = base + [
        {"role": "assistant", "content": choice["message"]["content"]},
        {"role": "user", "content": OBSERVATIONS[0]},
    ]
    second = _chat(embedded_engine, messages, temperature=0, max_tokens=1)["prompt_token_ids"]
    prompt = first["prompt_token_ids"]
    assert _break_offset(second[len(prompt) :], choice["token_ids"]) == 5
    assert choice["token_ids"][5:7] == [1398, 274]  # " list" "ing" (sampled)
    assert second[len(prompt) + 5] == 15656  # " listing"
    # one id fewer, then everything realigns (and the cut turn gets its <|im_end|>)
    n = len(prompt) + len(choice["token_ids"]) - 1
    assert second[len(prompt) + 6 : n] == choice["token_ids"][7:]
    assert second[n] == IM_END
