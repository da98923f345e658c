"""`kill -9` of a `tapdeck serve` under load (many sessions calling at once), then a restart on the
same data dir: every call whose reply reached its client is stored, byte for byte the request it
answered. (A run's own resumption after a crash is tests/runner/test_resume.py.)"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx
import pytest

from tapdeck.proxy.store.database import Store
from tests.support.fake_vllm import FakeVllm
from tests.support.tapdeck_process import serve_process, wait_health

pytestmark = pytest.mark.slow

SESSIONS = 16
KILL_AFTER = 48
"""Replies received, across all sessions, before the server is killed."""


def test_kill_9_under_load_loses_no_replied_turn(upstream: FakeVllm, tmp_path: Path, port_factory) -> None:
    data = tmp_path / "data"
    port = port_factory()
    url = f"http://127.0.0.1:{port}"
    proc = serve_process(port, data, upstream.base_url)
    replied: dict[str, list[str]] = {}
    lock = threading.Lock()
    enough = threading.Event()
    try:
        wait_health(url, proc)
        admin = {"Authorization": f"Bearer {(data / 'admin.key').read_text().strip()}"}
        infos = [
            httpx.post(f"{url}/admin/sessions", json={}, headers=admin, timeout=60).json()
            for _ in range(SESSIONS)
        ]

        def agent(info: dict) -> None:
            with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {info['api_key']}"}) as c:
                for i in range(1000):
                    text = f"{info['id']} call {i}"
                    try:
                        resp = c.post(
                            f"{url}/v1/chat/completions",
                            json={
                                "model": "m",
                                "max_tokens": 8,
                                "messages": [{"role": "user", "content": text}],
                            },
                        )
                    except httpx.HTTPError:
                        return  # the server died under this call
                    assert resp.status_code == 200, resp.text
                    with lock:
                        replied.setdefault(info["id"], []).append(text)
                        if sum(map(len, replied.values())) >= KILL_AFTER:
                            enough.set()

        agents = [threading.Thread(target=agent, args=(info,)) for info in infos]
        for a in agents:
            a.start()
        assert enough.wait(120), "the load never reached the kill point"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        for a in agents:
            a.join(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    proc = serve_process(port, data, upstream.base_url)
    try:
        wait_health(url, proc)
        admin = {"Authorization": f"Bearer {(data / 'admin.key').read_text().strip()}"}
        listed = {
            s["id"]: s
            for s in httpx.get(f"{url}/admin/sessions", headers=admin, timeout=60).json()["sessions"]
        }
        for sid, texts in replied.items():
            assert listed[sid]["state"] == "interrupted"
            assert listed[sid]["turns"] >= len(texts)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)

    with Store(data / "capture.db") as store:
        for sid, texts in replied.items():
            stored = [t.request["messages"][-1]["content"] for t in store.load_session(sid)[1]]
            assert stored[: len(texts)] == texts
