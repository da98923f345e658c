"""Store faults lose nothing and lie about nothing: a disk that fills up, a database that turns
read-only and one another process holds locked each answer the harness 503 in its own dialect,
while the session's turn count, budget, rollout document and a restarted server all hold exactly
the turns on disk; when the fault is lifted the next call is captured.

How each fault is made (all against the real SQLite file of a real server):
- disk full: the data dir is a 2 MB tmpfs that a filler file fills (needs mount rights, as root
  here and on CI's runner); without them, SQLite's `max_page_count` pinned to the file's size,
  which makes SQLite raise the very error (SQLITE_FULL) it raises on ENOSPC.
- read-only: `PRAGMA query_only` on the store's writer: SQLite then refuses writes with
  SQLITE_READONLY, the code a read-only file gives. (A mounted file system cannot be turned
  read-only under an open writer: `mount -o remount,ro` answers "mount point is busy".)
- locked: a second connection holds an exclusive write transaction; the store's busy timeout is
  cut to 50 ms so the test does not wait 10 s per call.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tapdeck.app.host import LocalServer
from tapdeck.proxy.config import ServerConfig
from tests.support.fake_vllm import FakeVllm
from tests.support.local_server import running

BUDGET = 12


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    return done.returncode == 0


@contextlib.contextmanager
def _fault(kind: str, server: LocalServer, data: Path, tmpfs: bool) -> Iterator[None]:
    """The fault is on inside the block and lifted when it ends."""
    store = server.service.store
    if kind == "disk_full" and tmpfs:
        filler = data / "filler"
        with open(filler, "wb") as fh, contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        try:
            yield
        finally:
            filler.unlink()
    elif kind == "disk_full":
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count={pages}")
        try:
            yield
        finally:
            store._db.execute("PRAGMA max_page_count=1073741823")
    elif kind == "read_only":
        store._db.execute("PRAGMA query_only=1")
        try:
            yield
        finally:
            store._db.execute("PRAGMA query_only=0")
    else:
        store._db.execute("PRAGMA busy_timeout=50")
        holder = sqlite3.connect(store.path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()


def _chat(url: str, key: str, text: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 8},
    )


def _anthropic(url: str, key: str, text: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/messages",
        timeout=60,
        headers={"x-api-key": key},
        json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": text}]},
    )


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[tuple[Path, bool]]:
    """The server's data dir: a 2 MB tmpfs when this process may mount one."""
    where = tmp_path / "data"
    mounted = _mount_tmpfs(where, "2m")
    try:
        yield where, mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.medium
@pytest.mark.parametrize("kind", ["disk_full", "read_only", "locked"])
def test_store_fault_answers_503_and_memory_matches_disk(
    kind: str, upstream: FakeVllm, data_dir: tuple[Path, bool]
) -> None:
    data, tmpfs = data_dir
    config = ServerConfig(host="127.0.0.1", port=0, data_dir=data, engine_url=upstream.base_url)
    with running(config) as (server, admin):
        info = admin.post("/admin/sessions", json={"call_budget": BUDGET}).json()
        key, sid = info["api_key"], info["id"]
        assert _chat(server.url, key, "first").status_code == 200
        refused: list[tuple[str, httpx.Response]] = []
        with _fault(kind, server, data, tmpfs):
            # Unique, large requests: a full disk has to refuse the turn's own bytes, not slack.
            for i in range(40):
                call: Callable[[str, str, str], httpx.Response] = _chat if i % 2 == 0 else _anthropic
                resp = call(server.url, key, f"{i} " + "x" * 60_000)
                if resp.status_code == 503:
                    refused.append((call.__name__, resp))
                    if len(refused) == 2:
                        break
                else:
                    assert resp.status_code == 200, resp.text
            assert len(refused) == 2, "the fault never reached the store"
            shown = admin.get(f"/admin/sessions/{sid}").json()
            doc = admin.get(f"/admin/sessions/{sid}/rollout").json()
        stored = len(server.service.store.load_session(sid)[1])
        assert shown["turns"] == stored == len(doc["turns"])
        # Each refusal is the dialect's own error envelope, saying the call was not recorded.
        for dialect, resp in refused:
            body = resp.json()
            assert "could not record this call" in body["error"]["message"]
            if dialect == "_anthropic":
                assert body["type"] == "error"
            else:
                assert body["error"]["type"]

        # Fault lifted: the proxy recovers, and refused calls never used the budget.
        answered = [_chat(server.url, key, f"after {i}") for i in range(BUDGET - stored + 1)]
        assert [r.status_code for r in answered] == [200] * len(answered)
        assert "budget" in answered[-1].json()["choices"][0]["message"]["content"]
        after = admin.get(f"/admin/sessions/{sid}").json()
        assert after["turns"] == BUDGET

    # A restarted server lists exactly what the first one said it held.
    with running(config) as (_restarted, admin):
        assert admin.get(f"/admin/sessions/{sid}").json()["turns"] == BUDGET
        assert len(admin.get(f"/admin/sessions/{sid}/rollout").json()["turns"]) == BUDGET


def test_opening_a_session_on_a_refusing_store_is_a_503(
    upstream: FakeVllm, make_server: Any, admin_for: Any
) -> None:
    server = make_server(upstream.base_url)
    server.service.store._db.execute("PRAGMA query_only=1")
    resp = admin_for(server).post("/admin/sessions", json={})
    assert resp.status_code == 503
    assert "store" in resp.json()["detail"]
    server.service.store._db.execute("PRAGMA query_only=0")
    assert admin_for(server).post("/admin/sessions", json={}).status_code == 200
    assert server.service.list()[0].state == "open"
    assert len(server.service.list()) == 1
