"""Settling gives way: after a reply, the engine re-evaluates it as a batch (`LlamaModel.settle`),
but stops between batches for the next caller of the model or a shutdown. What it leaves in the
cache is reused with the numbers a prefill from nothing gives."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.slow

BATCH = 512  # llama.cpp's n_batch in the engine (model._CHUNK)


def _text_ids(model: Any, n: int) -> list[int]:
    from pydoc_data.topics import topics

    ids = model.tokenize("\n\n".join(topics[k] for k in sorted(topics)[:40]))
    assert len(ids) >= n
    return ids[:n]


def test_a_settle_that_gives_way_leaves_a_cache_whose_reuse_equals_a_fresh_prefill(
    embedded_engine: Any,
) -> None:
    core = embedded_engine.core
    model = core.model
    ids = _text_ids(model, 600)
    prompt, reply, follow_up = ids[:40], ids[40:570], ids[570:]
    with core.lock:  # the server's callers wait: this test drives the model itself
        model.prefill(prompt)
        for token in reply:  # one position at a time, as a reply is sampled
            model.step(token)
        asked = iter([False, True])  # another caller shows up after the first batch
        before = model.evaluated
        model.settle(lambda: next(asked))
        assert model.evaluated - before == BATCH
        assert model.cached_tokens == len(prompt) - 1 + BATCH

        reused = model.prefill(ids)
        # Only what the settle did not reach is evaluated again (the last id alone, as always).
        assert model.prefilled == len(ids) - (len(prompt) - 1 + BATCH)
        model.prefill(follow_up)  # another conversation takes the cache
        fresh = model.prefill(ids)
        assert model.prefilled == len(ids)
    assert np.array_equal(reused, fresh)


def test_a_caller_waiting_for_the_model_stops_the_settle_of_the_reply_before_it(
    embedded_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = embedded_engine.core
    model = core.model
    real_settle = model.settle
    settled: list[int] = []
    second_caller_served = threading.Event()

    def settle_with_a_caller_waiting(interrupted: Any) -> None:
        # Runs under the model's lock right after the reply went out. From the second reply on,
        # another caller asks for the model now, before the settle's first batch.
        if settled:

            def second_caller() -> None:
                with core.holding():
                    second_caller_served.set()

            threading.Thread(target=second_caller, daemon=True).start()
            while not core.wanted():
                threading.Event().wait(0.01)
        before = model.evaluated
        real_settle(interrupted)
        settled.append(model.evaluated - before)

    monkeypatch.setattr(model, "settle", settle_with_a_caller_waiting)
    ids = _text_ids(model, 80)
    for prompt in (ids[:40], ids[40:]):
        body = {
            "model": embedded_engine.served_name,
            "prompt": prompt,
            "max_tokens": 8,
            "ignore_eos": True,
            "temperature": 0,
        }
        reply = httpx.post(f"{embedded_engine.base_url}/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
    assert second_caller_served.wait(60), "the second caller never got the model"
    # Alone, the settle re-evaluated the reply; with a caller waiting, nothing.
    assert settled[0] > 0 and settled[1:] == [0]
