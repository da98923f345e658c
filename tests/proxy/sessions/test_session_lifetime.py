"""Bounded memory: a closed session releases its live state (graph, interned messages, stored
Responses, tool-argument memo, the store's per-session delta base and stored message keys; its
activity entry is kept only while among the newest closed; the graphs of the last few sessions
read or closed are kept for the reads that follow), listing a restarted server's sessions keeps
no graph, stored Responses are bounded per session, and an engine that repeats its
reply ids cannot send a Responses chain round in a loop. Counted in live objects, not RSS (the
RSS soak is bench/load.py --soak)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import httpx
import pytest

from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.config import ServerConfig
from tapdeck.proxy.dialects.base import DialectError
from tapdeck.proxy.dialects.stored_responses import StoredResponses
from tapdeck.proxy.sessions import activity
from tapdeck.proxy.sessions.kept_graphs import KEPT_GRAPHS
from tests.support.fake_vllm import FakeVllm
from tests.support.local_server import running

SESSIONS = 12
CLOSED_KEPT = 4


def _live_graphs() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, RolloutGraph))


def _responses(url: str, key: str, text: str, previous: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {"model": "m", "input": text, "max_output_tokens": 8}
    if previous:
        body["previous_response_id"] = previous
    return httpx.post(
        f"{url}/v1/responses", json=body, timeout=60, headers={"Authorization": f"Bearer {key}"}
    )


@pytest.mark.medium
def test_closed_sessions_release_their_live_state(
    upstream: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(activity, "CLOSED_KEPT", CLOSED_KEPT)
    config = ServerConfig(host="127.0.0.1", port=0, data_dir=tmp_path / "data", engine_url=upstream.base_url)
    with running(config) as (server, admin):
        service = server.service
        before = _live_graphs()
        memos = {}
        for _ in range(SESSIONS):
            info = admin.post("/admin/sessions", json={}).json()
            first = _responses(server.url, info["api_key"], "hello").json()
            assert _responses(server.url, info["api_key"], "again", first["id"]).status_code == 200
            memos[info["id"]] = service._sessions[info["id"]].arguments
            admin.delete(f"/admin/sessions/{info['id']}")
        sessions = list(service._sessions.values())
        assert [s.state for s in sessions] == ["closed"] * SESSIONS
        assert all(
            s.graph is None
            and len(s.stored_responses) == 0
            and not s.interner._previous
            and s.arguments is not memos[s.id]
            and not s.arguments._items
            for s in sessions
        )
        assert service.store._previous == {} and service.store._stored_keys == {}
        assert _live_graphs() == before + KEPT_GRAPHS  # the last closed, whole, for the reads after
        # The newest closed sessions' last exchange stays readable (the TUI's pane), no more.
        assert service.activity._sessions == {}
        assert list(service.activity._closed) == [s.id for s in sessions][-CLOSED_KEPT:]
        ends = [admin.get(f"/admin/sessions/{s.id}/activity").json()["calls_ended"] for s in sessions]
        assert ends == [0] * (SESSIONS - CLOSED_KEPT) + [2] * CLOSED_KEPT
        # Still listed with their numbers, and exportable (the oldest rebuilt for it: one of the
        # kept graphs gives way).
        listed = admin.get("/admin/sessions").json()["sessions"]
        assert [s["turns"] for s in listed] == [2] * SESSIONS
        assert len(admin.get(f"/admin/sessions/{listed[-1]['id']}/rollout").json()["turns"]) == 2
        assert _live_graphs() == before + KEPT_GRAPHS

    with running(config) as (restarted, admin):
        listed = admin.get("/admin/sessions").json()["sessions"]
        assert [s["turns"] for s in listed] == [2] * SESSIONS
        assert all(s.graph is None for s in restarted.service._sessions.values())


@pytest.mark.medium
def test_a_closed_sessions_graph_is_built_once_for_the_reads_that_follow(
    upstream: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ServerConfig(host="127.0.0.1", port=0, data_dir=tmp_path / "data", engine_url=upstream.base_url)
    with running(config) as (server, admin):
        info = admin.post("/admin/sessions", json={}).json()
        assert _responses(server.url, info["api_key"], "hello").status_code == 200
        admin.delete(f"/admin/sessions/{info['id']}")
    with running(config) as (restarted, admin):
        store = restarted.service.store
        loads: list[str] = []
        load_graph = store.load_graph
        monkeypatch.setattr(store, "load_graph", lambda sid: loads.append(sid) or load_graph(sid))
        # What the TUI asks on opening a rollout: its graph, the session with findings, a turn.
        for path in ("/graph", "", "/turns/0", "/graph"):
            assert admin.get(f"/admin/sessions/{info['id']}{path}").status_code == 200, path
        assert loads == [info["id"]]
        # Demoting a call after the fact changes the graph those reads share.
        restarted.service.registry.mark_auxiliary(info["id"], [0], "not in the harness's trajectory")
        graph = admin.get(f"/admin/sessions/{info['id']}/graph").json()
        assert [t["role"] for t in graph["turns"]] == ["auxiliary"], graph["turns"]
        assert loads == [info["id"]]


def test_an_engine_repeating_reply_ids_still_chains_responses(
    upstream: FakeVllm, make_server: Any, admin_for: Any
) -> None:
    # The upstream answers every call with the same recorded body, id included.
    server = make_server(upstream.base_url)
    info = admin_for(server).post("/admin/sessions", json={}).json()
    ids = []
    previous = None
    for text in ("one", "two", "three"):
        resp = _responses(server.url, info["api_key"], text, previous)
        assert resp.status_code == 200, resp.text
        previous = resp.json()["id"]
        ids.append(previous)
    assert len(set(ids)) == 3
    # The third call's input was the whole chain: both earlier inputs reached the engine.
    sent = upstream.requests[-1]["messages"]
    assert [m["content"] for m in sent if m["role"] == "user"] == ["one", "two", "three"]


def test_stored_responses_are_bounded_and_a_chain_never_loops() -> None:
    stored = StoredResponses(limit=3)
    stored.remember({"input": "a"}, {"id": "r1", "output": []})
    # A reply claiming to follow itself is stored as a chain start, not a loop.
    stored.remember({"input": "b", "previous_response_id": "r1"}, {"id": "r1", "output": []})
    assert stored.expand({"input": "c", "previous_response_id": "r1"})["input"][0]["content"] == "b"
    for n in range(2, 6):
        stored.remember({"input": f"x{n}"}, {"id": f"r{n}", "output": []})
    assert len(stored) == 3
    with pytest.raises(DialectError):
        stored.expand({"input": "d", "previous_response_id": "r1"})


def test_a_session_closed_while_a_departed_callers_turn_commits_is_released_after_it(
    upstream: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The caller hangs up while its turn is being committed, and the session is closed meanwhile:
    # its live state is released once the turn is on disk, not before (the commit would rebuild
    # the store's per-session state for a session nobody will forget again).
    import json
    import socket
    import threading
    import time

    from tapdeck.proxy.capture.call import CallCapture

    committing, go_on = threading.Event(), threading.Event()
    commit = CallCapture._commit_turn

    def held_commit(self, session, turn):
        committing.set()
        assert go_on.wait(60)
        return commit(self, session, turn)

    monkeypatch.setattr(CallCapture, "_commit_turn", held_commit)
    config = ServerConfig(host="127.0.0.1", port=0, data_dir=tmp_path / "data", engine_url=upstream.base_url)
    with running(config) as (server, admin):
        info = admin.post("/admin/sessions", json={}).json()

        def leave_mid_commit() -> None:
            # Hung up once the turn is being committed (a client timeout could fire before it,
            # on a loaded machine, and then no turn is committed at all).
            body = json.dumps({"model": "m", "input": "hello", "max_output_tokens": 8}).encode()
            host, port = server.url.removeprefix("http://").rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=60) as sock:
                sock.sendall(
                    f"POST /v1/responses HTTP/1.1\r\nHost: {host}:{port}\r\n"
                    f"Authorization: Bearer {info['api_key']}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                committing.wait(60)

        caller = threading.Thread(target=leave_mid_commit)
        caller.start()
        try:
            assert committing.wait(60)
            caller.join()  # gone: it hung up mid-commit
            session = server.service._sessions[info["id"]]
            assert admin.delete(f"/admin/sessions/{info['id']}").status_code == 200
            assert session.in_flight == 1 and session.graph is not None  # held for the commit
        finally:
            go_on.set()
        deadline = time.monotonic() + 60
        while session.in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert session.in_flight == 0 and session.graph is None
        assert info["id"] not in server.service.store._previous
        assert info["id"] not in server.service.store._stored_keys
        assert admin.get(f"/admin/sessions/{info['id']}").json()["turns"] == 1
