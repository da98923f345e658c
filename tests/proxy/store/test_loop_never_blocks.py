"""Nothing a reader holds can stall a commit: store writes have their own executor, and the
event loop never takes the lock an export holds, nor reads a graph from the store.

The export is held deliberately (a wrapper that waits on an event while it holds its session's
graph lock) in as many admin requests, of as many sessions, as the default thread pool has threads, so every
worker that admin reads and sandbox copies share is stuck; another session's calls must all be answered
and captured before the exports are let go. No clock is read: the order of events is the result.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

import tapdeck.proxy.service as service_module
from tapdeck.proxy.config import ServerConfig
from tapdeck.proxy.store.database import Store
from tests.support.fake_vllm import FakeVllm
from tests.support.local_server import running

DEFAULT_POOL = min(32, (os.cpu_count() or 1) + 4)
"""asyncio's default executor size (what `asyncio.to_thread` runs on)."""


@pytest.mark.medium
def test_commits_complete_while_slow_exports_hold_every_reader_thread(
    upstream: FakeVllm, make_server: Any, admin_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make_server(upstream.base_url)
    admin = admin_for(server)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    url = f"{server.url}/v1/chat/completions"
    # One exported session per reader thread: each export holds its own session's lock.
    slow = [admin.post("/admin/sessions", json={}).json() for _ in range(DEFAULT_POOL)]
    for info in slow:
        assert (
            httpx.post(
                url, json=chat, headers={"Authorization": f"Bearer {info['api_key']}"}, timeout=60
            ).status_code
            == 200
        )
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
        with httpx.Client(
            base_url=server.url, timeout=120, headers={"Authorization": f"Bearer {server.admin_key}"}
        ) as reader:
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
                resp = client.post(url, json={**chat, "messages": [{"role": "user", "content": f"turn {i}"}]})
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


def _on_a_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def test_a_restarted_sessions_activity_is_read_without_loading_its_graph_on_the_loop(
    upstream: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ServerConfig(host="127.0.0.1", port=0, data_dir=tmp_path / "data", engine_url=upstream.base_url)
    with running(config) as (server, admin):
        info = admin.post("/admin/sessions", json={}).json()
        assert (
            httpx.post(
                f"{server.url}/v1/chat/completions",
                timeout=60,
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {info['api_key']}"},
            ).status_code
            == 200
        )
    loads: list[bool] = []  # per graph load: whether it ran on the loop's thread
    real_load = Store.load_graph

    def watched_load(self: Store, session_id: str) -> Any:
        loads.append(_on_a_loop())
        return real_load(self, session_id)

    monkeypatch.setattr(Store, "load_graph", watched_load)
    # Restarted: the session left open is `interrupted`, with no stored stats.
    with running(config) as (_restarted, admin):
        assert admin.get(f"/admin/sessions/{info['id']}/activity").status_code == 200
        assert admin.get("/admin/sessions/s-0000000000000000/activity").status_code == 404
        assert loads == []
        # Its summary does need the graph: loaded on a reader thread.
        assert admin.get(f"/admin/sessions/{info['id']}").json()["state"] == "interrupted"
        assert loads and not any(loads)
