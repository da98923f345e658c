"""Fixtures for the engine-client tests: the fake vLLM in this process (an httpx transport).

Every body it answers is a recorded vLLM 0.32 body from tests/fixtures/vllm/; its refusals are the
recorded refusals, triggered by the same conditions real vLLM checks (empty `tools`,
`stream_options` without streaming, `max_tokens` over max_model_len, `top_logprobs` without
`logprobs` or above 20, an unknown model). The fake on loopback is tests/conftest.py's `upstream`.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.fake_vllm import FakeVllm
from tests.support.vllm_recordings import vllm_fixture


@pytest.fixture
def inprocess_vllm() -> FakeVllm:
    """The fake vLLM answering the recorded reply, refusing as vLLM does; reach it by `.client()`."""
    return FakeVllm(refuse_like_vllm=True)


@pytest.fixture
def make_inprocess_vllm() -> Callable[..., FakeVllm]:
    """`make_inprocess_vllm(**kwargs)` → the in-process fake vLLM, refusing as vLLM does, set up
    as `kwargs` say."""
    return functools.partial(FakeVllm, refuse_like_vllm=True)


@pytest.fixture
def basic_chat() -> dict[str, Any]:
    """The chat request behind chat_basic.json, as a harness would send it (no capture fields)."""
    req = copy.deepcopy(vllm_fixture("chat_basic")["request"])
    for key in ("return_token_ids", "logprobs", "top_logprobs"):
        req.pop(key)
    return req
