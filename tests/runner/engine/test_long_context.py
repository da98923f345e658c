"""The embedded engine holds agents' long prompts: a 32k context (YaRN past SmolLM2's trained 8k),
reported as vLLM reports it, and a follow-up call evaluates only what it adds to the cached prefix."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow


def _text_ids(engine: Any, n: int) -> list[int]:
    from pydoc_data.topics import topics

    ids = engine.core.model.tokenize("\n\n".join(topics[k] for k in sorted(topics)))
    assert len(ids) >= n
    return ids[:n]


def test_engine_reports_its_stretched_context_as_max_model_len(embedded_engine: Any) -> None:
    from tapdeck.runner.engine.model import DEFAULT_N_CTX, trained_context

    model = embedded_engine.core.model
    assert model.n_ctx == DEFAULT_N_CTX == 32768 > trained_context(model.path) == 8192
    [listed] = httpx.get(f"{embedded_engine.base_url}/models").json()["data"]
    assert listed["max_model_len"] == 32768


def test_follow_up_with_a_shared_prefix_past_the_trained_context_evaluates_only_the_new_tokens(
    embedded_engine: Any,
) -> None:
    """About 90 s: the first call prefills 8,448 tokens on 2 cores. That is as small as the claim
    allows: the cached prefix must reach past the 8,192 tokens the model was trained with, so that
    the stretched context's cache is what the follow-up reuses (one KV block of 256 past it)."""
    from tapdeck.runner.engine.model import trained_context

    url = f"{embedded_engine.base_url}/completions"
    model = embedded_engine.core.model
    length = trained_context(model.path) + 256
    ids = _text_ids(embedded_engine, length + 50)
    prompt, added = ids[:length], ids[length:]
    first = httpx.post(
        url,
        json={
            "model": "smollm2",
            "prompt": prompt,
            "max_tokens": 4,
            "temperature": 0,
            "return_token_ids": True,
        },
        timeout=1800,
    ).json()["choices"][0]
    follow = prompt + first["token_ids"] + added
    second = httpx.post(
        url,
        json={"model": "smollm2", "prompt": follow, "max_tokens": 1, "temperature": 0, "logprobs": 0},
        timeout=1800,
    ).json()
    # The cache holds the prompt and every reply token but the last (sampled, never evaluated):
    # the follow-up evaluates that one, the 50 new tokens, and nothing of the prefix.
    assert model.prefilled == 1 + len(added)
    [lp] = second["choices"][0]["logprobs"]["token_logprobs"]
    assert math.isfinite(lp) and lp <= 0
