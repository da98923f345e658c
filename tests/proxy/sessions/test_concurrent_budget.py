"""The call budget holds under concurrent calls: a call whose engine reply is in but whose turn
is still being committed keeps its place, so calls arriving meanwhile cannot overshoot."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.support.fake_vllm import FakeVllm

BUDGET = 3


def test_budget_holds_while_commits_are_pending(upstream: FakeVllm, make_server: Any, admin_for: Any) -> None:
    server = make_server(upstream.base_url)
    info = admin_for(server).post("/admin/sessions", json={"call_budget": BUDGET}).json()
    store = server.service.store
    live = server.service.registry.sessions[info["id"]]
    release = threading.Event()
    pending = threading.Semaphore(0)
    real_append = store.append_turn

    def held_append(*args: Any) -> None:
        pending.release()
        release.wait()
        real_append(*args)

    store.append_turn = held_append  # type: ignore[method-assign]

    def call(i: int) -> str:
        resp = httpx.post(
            f"{server.url}/v1/chat/completions",
            timeout=60,
            headers={"Authorization": f"Bearer {info['api_key']}"},
            json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": f"call {i}"}]},
        )
        assert resp.status_code == 200, resp.text
        return resp.json()["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(2 * BUDGET) as pool:
        first = [pool.submit(call, i) for i in range(BUDGET)]
        # The first commit is held (the others queue behind its session's lock). The late calls
        # go once every first call holds its place: the pool may start one only after that
        # commit, and a late call arriving before it would take its place.
        assert pending.acquire(timeout=60)
        deadline = time.monotonic() + 60
        while live.in_flight < BUDGET:
            assert time.monotonic() < deadline, f"only {live.in_flight} first calls in flight"
            time.sleep(0.01)
        late = [pool.submit(call, BUDGET + i) for i in range(BUDGET)]
        late_texts = [f.result(timeout=60) for f in late]
        release.set()
        first_texts = [f.result(timeout=60) for f in first]
    assert all("budget" in text for text in late_texts)
    assert not any("budget" in text for text in first_texts)
    assert len(store.load_session(info["id"])[1]) == BUDGET
