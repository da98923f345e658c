"""The proxy's output cap, through a capture server in front of the fake vLLM: on a served engine
that says its context, a harness's own output request stands up to that context; tapdeck's embedded
engine (known by its replies' `system_fingerprint`), and an engine that does not say its context,
get at most DEFAULT_MAX_TOKENS_CAP."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tapdeck.proxy.upstream.client import DEFAULT_MAX_TOKENS_CAP
from tapdeck.proxy.upstream.tiers import EngineSpec
from tests.support.capture_server import SCRIPTED_KEEPALIVE_S, CaptureServer, capture_server
from tests.support.fake_vllm import FakeVllm, vllm_listing
from tests.support.findings import rendered
from tests.support.vllm_recordings import vllm_fixture, vllm_reply_to

SERVED_CONTEXT = 131072
"""A served model's context, as vLLM lists it for `--max-model-len 131072`."""
VLLM = vllm_fixture("chat_basic")["response"]["system_fingerprint"]
EMBEDDED = "tapdeck-embedded-0.1.0"
ASKED = 32000
"""Above the cap, within a served model's context (claude-code asks 32,000 on some models)."""


@contextlib.contextmanager
def engine_behind_proxy(
    tmp_path: Path, *, fingerprint: str, max_model_len: int | None
) -> Iterator[tuple[FakeVllm, CaptureServer]]:
    """The fake vLLM, its replies naming it `fingerprint` and its listing saying `max_model_len`
    (None: no context listed), with a capture server in front."""
    recorded = vllm_fixture("chat_basic")["response"]
    listing = vllm_listing(max_model_len=max_model_len)
    if max_model_len is None:
        del listing["data"][0]["max_model_len"]
    with (
        FakeVllm(
            answer=lambda body: (200, {**vllm_reply_to(body, recorded), "system_fingerprint": fingerprint}),
            listing=listing,
        ) as up,
        capture_server(EngineSpec(url=up.base_url), tmp_path, keepalive_s=SCRIPTED_KEEPALIVE_S) as capture,
    ):
        yield up, capture


def _chat(capture: CaptureServer, max_tokens: int | None) -> str:
    """One chat call asking `max_tokens` (None: no limit) in a new session; its turn's findings."""
    info = capture.open_session()
    client = openai.OpenAI(api_key=info["api_key"], base_url=info["base_urls"]["openai"], max_retries=0)
    extra = {} if max_tokens is None else {"max_tokens": max_tokens}
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], **extra)
    return "\n".join(rendered(capture.turn(info["id"], 0)["findings"]))


def test_a_served_engine_gets_the_harness_own_request_up_to_its_context(tmp_path: Path) -> None:
    with engine_behind_proxy(tmp_path, fingerprint=VLLM, max_model_len=SERVED_CONTEXT) as (up, capture):
        findings = _chat(capture, ASKED)
        assert up.requests[-1]["max_tokens"] == ASKED, findings
        assert "max_tokens_capped" not in findings
        # No limit asked: as much as the context holds (vLLM takes the prompt's share off).
        _chat(capture, None)
        assert up.requests[-1]["max_tokens"] == SERVED_CONTEXT
        # More than the context: the context, which vLLM would otherwise refuse.
        findings = _chat(capture, 200000)
        assert up.requests[-1]["max_tokens"] == SERVED_CONTEXT
        assert f"asked for max_tokens=200000; the engine was sent {SERVED_CONTEXT}" in findings


@pytest.mark.parametrize(
    ("fingerprint", "max_model_len"),
    [(EMBEDDED, 32768), (VLLM, None)],
    ids=["embedded-engine", "served-engine-without-a-context"],
)
def test_the_embedded_engine_and_an_unsaid_context_keep_the_proxys_cap(
    tmp_path: Path, fingerprint: str, max_model_len: int | None
) -> None:
    with engine_behind_proxy(tmp_path, fingerprint=fingerprint, max_model_len=max_model_len) as (
        up,
        capture,
    ):
        findings = _chat(capture, ASKED)
        assert up.requests[-1]["max_tokens"] == DEFAULT_MAX_TOKENS_CAP
        assert f"asked for max_tokens={ASKED}; the engine was sent {DEFAULT_MAX_TOKENS_CAP}" in findings
        _chat(capture, None)
        assert up.requests[-1]["max_tokens"] == DEFAULT_MAX_TOKENS_CAP
