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


def test_follow_up_with_a_shared_10k_prefix_evaluates_only_the_new_tokens(embedded_engine: Any) -> None:
    """About 125 s: the first call prefills 10,000 tokens on 2 cores; a prefix past the model's
    trained 8k context is what checks that the stretched context's cache is reused."""
    url = f"{embedded_engine.base_url}/completions"
    model = embedded_engine.core.model
    ids = _text_ids(embedded_engine, 10_050)
    prompt, added = ids[:10_000], ids[10_000:]
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
    # the follow-up evaluates that one, the 50 new tokens, and nothing of the 10k prefix.
    assert model.prefilled == 1 + len(added)
    [lp] = second["choices"][0]["logprobs"]["token_logprobs"]
    assert math.isfinite(lp) and lp <= 0
