"""SQLite capture store: exact round trips, durability under kill -9, restart."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import orjson
import pytest

from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.store.database import Store
from tapdeck.schema.findings import Finding
from tests.support.recorded_turns import turn_from_fixture

TINY = ["tiny/chat_multiturn_1", "tiny/chat_multiturn_2", "tiny/chat_multiturn_3"]
MULTI = ["chat_multiturn_1", "chat_multiturn_2", "chat_multiturn_3"]


def capture(store, session, turns, order=None):
    g = RolloutGraph()
    for i in order if order is not None else range(len(turns)):
        store.append_turn(turns[i], g.add(turns[i]))
    return g


def assert_same(a, b):
    assert a.seq == b.seq and a.finish_reason == b.finish_reason
    for x, y in ((a.prompt_ids, b.prompt_ids), (a.sampled_ids, b.sampled_ids)):
        assert (x is None) == (y is None)
        if x is not None:
            assert y.dtype == np.int32 and np.array_equal(x, y)
    assert np.array_equal(a.logprobs, b.logprobs)
    assert a.request == b.request and a.response == b.response and a.token_texts == b.token_texts
    assert a.findings == b.findings and a.meta == b.meta


def test_session_round_trip_is_exact_including_breaks(tmp_path):
    store = Store(tmp_path / "capture.db")
    store.create_session({"id": "s1", "tier": "tokens", "metadata": {"task": "t"}})
    turns = [turn_from_fixture(n, i) for i, n in enumerate(MULTI + TINY)]
    turns[1].findings = [Finding.warn("truncated", "x", 1)]
    capture(store, "s1", turns)
    rec, loaded = store.load_session("s1")
    assert rec["metadata"] == {"task": "t"}
    for a, b in zip(turns, loaded, strict=True):
        assert_same(a, b)


def test_prompts_are_stored_as_deltas(tmp_path):
    store = Store(tmp_path / "capture.db")
    store.create_session({"id": "s1"})
    turns = [turn_from_fixture(n, i) for i, n in enumerate(MULTI)]
    capture(store, "s1", turns)
    db = sqlite3.connect(tmp_path / "capture.db")
    rows = db.execute(
        "SELECT seq, base_seq, base_len, length(prompt_tail) FROM turns ORDER BY seq"
    ).fetchall()
    assert rows == [(0, None, 0, 48 * 4), (1, 0, 64, (87 - 64) * 4), (2, 1, 100, (121 - 100) * 4)]


def test_reconstruction_stays_exact_after_reparenting(tmp_path):
    """Turn 2 arrives before its parent: stored against turn 0, later adopted by turn 1."""
    store = Store(tmp_path / "capture.db")
    store.create_session({"id": "s1"})
    turns = [turn_from_fixture(n, i) for i, n in enumerate(MULTI)]
    g = capture(store, "s1", turns, order=[0, 2, 1])
    assert g.nodes[2].parent == 1
    _, loaded = store.load_session("s1")
    for a, b in zip(turns, loaded, strict=True):
        assert_same(a, b)
    _, rebuilt = store.load_graph("s1")
    assert {s: rebuilt.link(s).parent for s in rebuilt.nodes} == {0: None, 1: 0, 2: 1}


def test_update_and_list_sessions_survive_restart(tmp_path):
    path = tmp_path / "capture.db"
    store = Store(path)
    store.create_session({"id": "a", "created_at": 1.0})
    store.create_session({"id": "b", "created_at": 2.0})
    capture(store, "b", [turn_from_fixture(n, i, "b") for i, n in enumerate(MULTI)])
    store.update_session("b", state="closed", metadata={"reward": 1.0})
    store.close()
    again = Store(path)
    listed = again.list_sessions()
    assert [s["id"] for s in listed] == ["a", "b"]
    assert listed[1]["state"] == "closed" and listed[1]["stored_turns"] == 3
    rec, g = again.load_graph("b")
    assert rec["metadata"] == {"reward": 1.0} and g.stats().turns == 3 and g.stats().roots == 1


def test_wal_and_full_sync_are_on(tmp_path):
    store = Store(tmp_path / "capture.db")
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    for db in (store._db, store._reader):
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_concurrent_appends_from_threads(tmp_path):
    store = Store(tmp_path / "capture.db")
    base = turn_from_fixture("chat_basic", 0)
    errors = []

    def worker(sid):
        try:
            store.create_session({"id": sid})
            g = RolloutGraph()
            for i in range(20):
                t = dataclasses.replace(base, session_id=sid, seq=i)
                store.append_turn(t, g.add(t))
        except Exception as exc:  # noqa: BLE001 - any thread's error is surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"s{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [s["stored_turns"] for s in store.list_sessions()] == [20] * 4


WRITER = r"""
import sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.store.database import Store
from tests.support.recorded_turns import turn_from_fixture

store = Store(sys.argv[1])
store.create_session({"id": "live"})
g = RolloutGraph()
t = turn_from_fixture("chat_multiturn_1", 0, "live")
prompt, sampled = t.prompt_ids, t.sampled_ids
seq = 0
while True:
    t.seq, t.prompt_ids, t.sampled_ids = seq, prompt, sampled
    store.append_turn(t, g.add(t))
    print(seq, len(prompt), flush=True)
    prompt = np.concatenate([prompt, sampled, np.array([198, 1, 4093, 198, seq % 500 + 10], np.int32)])
    seq += 1
"""


def test_every_acknowledged_turn_survives_kill_9(tmp_path):
    path = tmp_path / "capture.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(Path(__file__).resolve().parents[3])],
        stdout=subprocess.PIPE,
        text=True,
    )
    acked = {}
    try:
        for line in proc.stdout:
            seq, plen = map(int, line.split())
            acked[seq] = plen
            if seq >= 40:
                break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    _, turns = Store(path).load_session("live")
    got = {t.seq: len(t.prompt_ids) for t in turns}
    assert all(got.get(s) == n for s, n in acked.items())
    for a, b in zip(turns, turns[1:], strict=False):  # every stored prompt extends the previous exactly
        assert np.array_equal(b.prompt_ids[: len(a.prompt_ids)], a.prompt_ids)


# -- group commit ---------------------------------------------------------------------------


def _hold_write_lock(path):
    """Another connection holding SQLite's write lock: the store's next BEGIN waits behind it."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    return other


def _append_in_threads(store, turns, results):
    def worker(i):
        try:
            store.append_turn(turns[i], RolloutGraph().add(turns[i]))
            results[i] = None
        except Exception as exc:  # noqa: BLE001 - whatever a write raised is checked by the test
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(turns))]
    for t in threads:
        t.start()
    return threads


def _wait_until_queued(store, n, threads):
    """Until `n` writes wait behind the blocked group leader (or every thread is done)."""
    while store.queued < n and any(t.is_alive() for t in threads):
        threading.Event().wait(0.001)


def _append_behind_a_released_lock(store, path, turns):
    """Append `turns` from threads while another connection holds the write lock, release it once
    writes queue behind the blocked leader; returns each append's error (None when it committed)."""
    results = {}
    other = _hold_write_lock(path)
    threads = _append_in_threads(store, turns, results)
    _wait_until_queued(store, 2, threads)
    other.execute("COMMIT")
    for t in threads:
        t.join()
    return results


def test_concurrent_appends_share_commits_and_all_are_durable(tmp_path):
    path = tmp_path / "capture.db"
    store = Store(path)
    store.create_session({"id": "s1"})
    base = turn_from_fixture("chat_basic", 0)
    turns = [dataclasses.replace(base, seq=i) for i in range(32)]
    commits_before = store.commits
    results = _append_behind_a_released_lock(store, path, turns)
    assert results == {i: None for i in range(32)}
    # Every write queued behind the blocked leader went into the next single transaction.
    assert 1 <= store.commits - commits_before < len(turns)
    store.close()
    _, loaded = Store(path).load_session("s1")
    assert [t.seq for t in loaded] == list(range(32))
    for a, b in zip(turns, loaded, strict=True):
        assert_same(a, b)


def test_failed_write_fails_only_itself_and_its_group_mates_commit(tmp_path):
    path = tmp_path / "capture.db"
    store = Store(path)
    store.create_session({"id": "s1"})
    base = turn_from_fixture("chat_basic", 0)
    store.append_turn(base, RolloutGraph().add(base))
    turns = [dataclasses.replace(base, seq=i) for i in range(8)]  # seq 0 is stored already
    results = _append_behind_a_released_lock(store, path, turns)
    assert isinstance(results[0], sqlite3.IntegrityError)
    assert all(results[i] is None for i in range(1, 8))
    store.close()
    assert [t.seq for t in Store(path).load_session("s1")[1]] == list(range(8))


def test_failed_group_commit_reaches_every_waiter_and_stores_nothing(tmp_path):
    path = tmp_path / "capture.db"
    store = Store(path, busy_timeout=0.2)
    store.create_session({"id": "s1"})
    base = turn_from_fixture("chat_basic", 0)
    turns = [dataclasses.replace(base, seq=i) for i in range(8)]
    results = {}
    other = _hold_write_lock(path)  # held throughout: every group's BEGIN times out
    threads = _append_in_threads(store, turns, results)
    _wait_until_queued(store, 2, threads)
    for t in threads:
        t.join()
    other.execute("ROLLBACK")
    errors = list(results.values())
    assert len(errors) == 8
    assert all(isinstance(e, sqlite3.OperationalError) and "locked" in str(e) for e in errors)
    assert len({id(e) for e in errors}) < len(errors)  # a group's one failure reached all its waiters
    assert store.load_session("s1")[1] == []
    store.append_turn(base, RolloutGraph().add(base))  # the store still works afterwards
    assert [t.seq for t in store.load_session("s1")[1]] == [0]


def test_close_commits_queued_appends_then_refuses_writes(tmp_path):
    path = tmp_path / "capture.db"
    store = Store(path)
    store.create_session({"id": "s1"})
    base = turn_from_fixture("chat_basic", 0)
    turns = [dataclasses.replace(base, seq=i) for i in range(8)]
    results = {}
    other = _hold_write_lock(path)
    threads = _append_in_threads(store, turns, results)
    _wait_until_queued(store, 1, threads)
    closer = threading.Thread(target=store.close)
    closer.start()
    other.execute("COMMIT")
    for t in [*threads, closer]:
        t.join()
    assert results == {i: None for i in range(8)}
    assert [t.seq for t in Store(path).load_session("s1")[1]] == list(range(8))
    with pytest.raises(RuntimeError, match="closed"):
        store.append_turn(base, RolloutGraph().add(base))


def _conversation_turns(n):
    """`n` turns of one agent conversation: each resends every earlier message plus two new ones."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "run a command",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            },
        }
    ]
    msgs = [
        {"role": "system", "content": "You are an agent."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "fix the bug"}, {"type": "text", "text": "in main.py"}],
        },
    ]
    turns = []
    for k in range(n):
        reply = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{k}",
                    "type": "function",
                    "function": {"name": "bash", "arguments": f'{{"cmd": "ls {k}"}}'},
                }
            ],
        }
        turns.append(
            dataclasses.replace(
                turn_from_fixture(MULTI[0], k),
                request={"model": "m", "messages": list(msgs), "tools": tools, "temperature": 0.5},
                response=reply,
            )
        )
        msgs = msgs + [reply, {"role": "tool", "tool_call_id": f"call_{k}", "content": f"out {k}"}]
    return turns


def test_requests_round_trip_exactly_through_content_addressed_messages(tmp_path):
    store = Store(tmp_path / "capture.db")
    store.create_session({"id": "s1"})
    turns = _conversation_turns(4)
    # Same message, other key order: one stored row (the key is canonical), equal on load.
    turns[3].request["messages"][0] = {"content": "You are an agent.", "role": "system"}
    turns.append(dataclasses.replace(turn_from_fixture(MULTI[0], 4), request={"messages": "odd"}))
    capture(store, "s1", turns)
    _, loaded = store.load_session("s1")
    for a, b in zip(turns, loaded, strict=True):
        assert b.request == a.request
    # The body keeps the key order it was first sent with.
    assert orjson.dumps(loaded[0].request) == orjson.dumps(turns[0].request)


def _stored_keys(doc: bytes) -> int:
    return len(re.findall(rb'"[0-9a-f]{64}"', doc))


def test_a_late_turn_stores_its_new_message_keys_not_the_conversations(tmp_path):
    store = Store(tmp_path / "capture.db")
    store.create_session({"id": "s1"})
    turns = _conversation_turns(50)
    capture(store, "s1", turns)
    db = sqlite3.connect(tmp_path / "capture.db")
    docs = dict(db.execute("SELECT seq, doc FROM turns"))
    # Turn 0 names its 2 messages and 1 tool; each later turn only its 2 new messages.
    assert [_stored_keys(docs[k]) for k in (0, 1, 25, 49)] == [3, 2, 2, 2]
    assert len(docs[49]) < 2 * len(docs[1])


def test_message_key_deltas_load_whatever_order_turns_were_stored_in(tmp_path):
    turns = _conversation_turns(8)
    # A retry of turn 2 (fewer messages than the turn stored before it) and an edited history.
    turns.append(dataclasses.replace(turns[2], seq=8))
    edited = copy.deepcopy(turns[6].request)
    edited["messages"][1] = {"role": "user", "content": "another task"}
    turns.append(dataclasses.replace(turns[6], seq=9, request=edited))
    order = [0, 3, 1, 2, 8, 5, 4, 9, 7, 6]
    store = Store(tmp_path / "capture.db")
    store.create_session({"id": "s1"})
    g = RolloutGraph()
    for i in order[:5]:
        store.append_turn(turns[i], g.add(turns[i]))
    store.close()
    store = Store(tmp_path / "capture.db")  # a restart: no previous turn in memory
    for i in order[5:]:
        store.append_turn(turns[i], g.add(turns[i]))
    _, loaded = store.load_session("s1")
    assert [t.request for t in loaded] == [t.request for t in turns]


def test_a_missing_message_delta_base_is_a_clear_error(tmp_path):
    store = Store(tmp_path / "capture.db")
    store.create_session({"id": "s1"})
    capture(store, "s1", [dataclasses.replace(t, prompt_ids=None) for t in _conversation_turns(3)])
    store.close()
    db = sqlite3.connect(tmp_path / "capture.db")
    db.execute("DELETE FROM turns WHERE seq = 1")
    db.commit()
    with pytest.raises(ValueError, match="turn s1/2's messages are stored against turn 1, which is missing"):
        Store(tmp_path / "capture.db").load_session("s1")


def test_each_distinct_message_is_stored_once(tmp_path):
    store = Store(tmp_path / "capture.db")
    store.create_session({"id": "s1"})
    turns = _conversation_turns(50)
    capture(store, "s1", turns)
    db = sqlite3.connect(tmp_path / "capture.db")
    # system + user + (assistant + tool) per earlier turn, + the one tool definition
    assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2 + 2 * 49 + 1
    last_doc = db.execute("SELECT doc FROM turns WHERE seq = 49").fetchone()[0]
    assert b"out 48" not in last_doc
    _, loaded = store.load_session("s1")
    assert [t.request for t in loaded] == [t.request for t in turns]
    # One parsed object per distinct message, shared by every turn that sent it.
    assert loaded[49].request["messages"][0] is loaded[1].request["messages"][0]


def test_failed_append_leaves_no_message_behind_and_a_later_turn_stores_it(tmp_path):
    store = Store(tmp_path / "capture.db")
    store.create_session({"id": "s1"})
    turns = _conversation_turns(3)
    store.append_turn(turns[0], RolloutGraph().add(turns[0]))
    dup = dataclasses.replace(turns[2], seq=0)  # same key as turn 0: the insert fails
    with pytest.raises(sqlite3.IntegrityError):
        store.append_turn(dup, RolloutGraph().add(dup))
    db = sqlite3.connect(tmp_path / "capture.db")
    assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 3
    store.append_turn(turns[2], RolloutGraph().add(turns[2]))
    _, loaded = store.load_session("s1")
    assert [t.request for t in loaded] == [turns[0].request, turns[2].request]


def test_a_forgotten_session_drops_its_stored_message_keys_and_shared_messages_still_load(tmp_path):
    store = Store(tmp_path / "capture.db")
    turns = {
        sid: [dataclasses.replace(t, session_id=sid) for t in _conversation_turns(3)] for sid in ("s1", "s2")
    }
    for sid in turns:
        store.create_session({"id": sid})
        capture(store, sid, turns[sid][:2])
    assert set(store._stored_keys) == {"s1", "s2"}
    store.forget("s1")
    assert set(store._stored_keys) == {"s2"}
    capture(store, "s2", turns["s2"][2:])  # messages s1 stored too: written once all the same
    db = sqlite3.connect(tmp_path / "capture.db")
    assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2 + 2 * 2 + 1
    for sid, stored in (("s1", 2), ("s2", 3)):
        _, loaded = store.load_session(sid)
        assert [t.request for t in loaded] == [t.request for t in turns[sid][:stored]]
