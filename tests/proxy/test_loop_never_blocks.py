"""Nothing a reader holds can stall a commit: store writes have their own executor, and the
event loop never takes the lock an export holds.

The export is held deliberately (a wrapper that waits on an event while it holds its session's
graph lock) in as many admin requests, of as many sessions, as the default thread pool has threads, so every worker
that admin reads and sandbox copies share is stuck; another session's calls must all be answered
and captured before the exports are let go. No clock is read: the order of events is the result.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import httpx
import pytest

import tapdeck.proxy.service as service_module
from tests.proxy.conftest import Upstream

DEFAULT_POOL = min(32, (os.cpu_count() or 1) + 4)
"""asyncio's default executor size (what `asyncio.to_thread` runs on)."""


def test_commits_complete_while_slow_exports_hold_every_reader_thread(
        upstream: Upstream, make_server: Any, admin_for: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    server = make_server(upstream.base_url)
    admin = admin_for(server)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    url = f"{server.url}/v1/chat/completions"
    # One exported session per reader thread: each export holds its own session's lock.
    slow = [admin.post("/admin/sessions", json={}).json() for _ in range(DEFAULT_POOL)]
    for info in slow:
        assert httpx.post(url, json=chat, headers={"Authorization": f"Bearer {info['api_key']}"},
                          timeout=60).status_code == 200
    busy = admin.post("/admin/sessions", json={}).json()

    release = threading.Event()
    entered = threading.Semaphore(0)
    real_export = service_module.rollout_document

    def held_export(*args: Any, **kwargs: Any) -> Any:
        entered.release()
        release.wait()
        return real_export(*args, **kwargs)

    monkeypatch.setattr(service_module, "rollout_document", held_export)
    events: list[str] = []

    def export(session_id: str) -> None:
        with httpx.Client(base_url=server.url, timeout=120,
                          headers={"Authorization": f"Bearer {server.admin_key}"}) as reader:
            assert reader.get(f"/admin/sessions/{session_id}/rollout").status_code == 200
        events.append("export")

    readers = [threading.Thread(target=export, args=(info["id"],)) for info in slow]
    try:
        for reader in readers:
            reader.start()
        for _ in range(DEFAULT_POOL):
            assert entered.acquire(timeout=60), "an export never started"
        # Every default-pool thread is now inside an export, one of them holding the lock.
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {busy['api_key']}"}) as client:
            for i in range(3):
                resp = client.post(url, json={**chat, "messages": [
                    {"role": "user", "content": f"turn {i}"}]})
                assert resp.status_code == 200, resp.text
                events.append("commit")
        turns = server.service.store.load_session(busy["id"])[1]
        assert len(turns) == 3
        assert events == ["commit"] * 3
    finally:
        release.set()
        for reader in readers:
            reader.join(60)
    assert events == ["commit"] * 3 + ["export"] * DEFAULT_POOL
