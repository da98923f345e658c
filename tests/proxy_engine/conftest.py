"""A recorded-vLLM upstream for the engine-client tests.

Every body it answers is a recorded vLLM 0.32 body from tests/fixtures/vllm/, verbatim; its
refusals are the recorded refusals, triggered by the same conditions real vLLM checks (empty
`tools`, `stream_options` without streaming, `max_tokens` over max_model_len, `top_logprobs`
without `logprobs` or above 20, an unknown model).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tapdeck.proxy.upstream.reasoning import MarkerCache, read_markers
from tests.conftest import vllm_error_case as recorded_error
from tests.conftest import vllm_fixture as recorded

ENGINE_URL = "http://vllm.test:8111/v1"




def vllm_refusal(body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """The refusal real vLLM 0.32 gives this body (recorded), or None if it would accept it."""
    if body.get("model") != "smollm2":
        return recorded_error("unknown_model")
    if body.get("tools") == []:
        return recorded_error("empty_tools")
    if "stream_options" in body and not body.get("stream"):
        return recorded_error("stream_options_without_stream")
    if (body.get("max_tokens") or 0) > 2048:
        return recorded_error("max_tokens_over_context")
    if body.get("top_logprobs") is not None and not body.get("logprobs"):
        return recorded_error("top_logprobs_without_logprobs")
    if (body.get("top_logprobs") or 0) > 20:
        return recorded_error("top_logprobs_too_large")
    return None


class RecordedUpstream:
    """httpx transport answering like the recorded vLLM server; records what it was sent."""

    def __init__(self, reply: Callable[[dict[str, Any]], tuple[int, Any]] | str = "chat_basic",
                 models: dict[str, Any] | None = None) -> None:
        self.reply = reply
        self.models = models if models is not None else recorded("models")["models"]["response"]
        self.requests: list[httpx.Request] = []
        self.bodies: list[dict[str, Any]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if request.method == "GET" and path.endswith("/models"):
            return httpx.Response(200, json=self.models)
        if request.method == "POST" and path.endswith("/chat/completions"):
            body = json.loads(request.content)
            self.bodies.append(body)
            refusal = vllm_refusal(body)
            if refusal is not None:
                return httpx.Response(refusal[0], json=refusal[1])
            if callable(self.reply):
                status, payload = self.reply(body)
            else:
                status, payload = 200, recorded(self.reply)["response"]
            if isinstance(payload, (bytes, str)):
                return httpx.Response(status, content=payload, headers={"content-type": "text/html"})
            return httpx.Response(status, json=payload)
        return httpx.Response(404, json={"detail": "Not Found"})

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handler))


@pytest.fixture
def upstream() -> RecordedUpstream:
    return RecordedUpstream()


@pytest.fixture
def basic_chat() -> dict[str, Any]:
    """The chat request behind chat_basic.json, as a harness would send it (no capture fields)."""
    req = copy.deepcopy(recorded("chat_basic")["request"])
    for key in ("return_token_ids", "logprobs", "top_logprobs"):
        req.pop(key)
    return req


@pytest.fixture
def vllm() -> Callable[[str], dict[str, Any]]:
    """Loader of recorded fixture files (see `recorded`)."""
    return recorded


@pytest.fixture
def vllm_error() -> Callable[[str], tuple[int, dict[str, Any]]]:
    """Loader of errors.json cases (see `recorded_error`)."""
    return recorded_error


@pytest.fixture
def make_upstream() -> type[RecordedUpstream]:
    return RecordedUpstream


def smollm2_markers() -> MarkerCache:
    """A marker cache that already holds what recorded vLLM said of SmolLM2 (no reasoning markers),
    so a planner under test asks its engine nothing for them."""
    reply = recorded("tokenize_reasoning_markers")["response"]
    return MarkerCache({("http://vllm.test/v1", "smollm2"): read_markers(reply)})
