"""The store keeps each turn's policy version stamp in columns of its own (POLICY_COLUMNS), written
in the turn's one INSERT; a store an older tapdeck wrote gets them on its first read-write open,
and reads back (read-only too) with its turns unstamped."""

from __future__ import annotations

import sqlite3

from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.capture.policy_stamp import PolicyStamp
from tapdeck.proxy.store.database import POLICY_COLUMNS, Store
from tests.support.recorded_turns import turn_from_fixture

MULTI = ["chat_multiturn_1", "chat_multiturn_2", "chat_multiturn_3"]
STAMPS = [PolicyStamp("trainer", 0, 0), PolicyStamp("weight_info", "step-a", "step-b"), None]


def _store_turns(store: Store) -> None:
    store.create_session({"id": "s1", "tier": "tokens"})
    graph = RolloutGraph()
    for i, name in enumerate(MULTI):
        turn = turn_from_fixture(name, i)
        turn.policy = STAMPS[i]
        store.append_turn(turn, graph.add(turn))


def test_stamps_round_trip_with_their_types(tmp_path):
    with Store(tmp_path / "capture.db") as store:
        _store_turns(store)
    with Store(tmp_path / "capture.db", read_only=True) as store:
        _, turns = store.load_session("s1")
    assert [t.policy for t in turns] == STAMPS
    assert type(turns[0].policy.before) is int and type(turns[1].policy.after) is str
    assert turns[1].policy.version is None and turns[1].policy.straddled == ("step-a", "step-b")


def test_a_store_without_the_columns_gets_them_and_its_old_turns_read_unstamped(tmp_path):
    path = tmp_path / "capture.db"
    with Store(path) as store:
        _store_turns(store)
    db = sqlite3.connect(path)
    for name, _ in POLICY_COLUMNS:  # as an older tapdeck wrote it
        db.execute(f"ALTER TABLE turns DROP COLUMN {name}")
    db.commit()
    db.close()

    with Store(path, read_only=True) as store:  # a reader changes nothing
        _, turns = store.load_session("s1")
    assert [t.policy for t in turns] == [None] * 3
    assert not {name for name, _ in POLICY_COLUMNS} & _columns(path)

    with Store(path) as store:
        _, turns = store.load_session("s1")
        assert [t.policy for t in turns] == [None] * 3
        graph = RolloutGraph()
        for t in turns:
            graph.add(t)
        new = turn_from_fixture("chat_multiturn_1", 3)
        new.policy = PolicyStamp("reply", 2, 2)
        store.append_turn(new, graph.add(new))
        _, turns = store.load_session("s1")
    assert [t.policy for t in turns] == [None, None, None, PolicyStamp("reply", 2, 2)]
    assert {name for name, _ in POLICY_COLUMNS} <= _columns(path)


def _columns(path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {row[1] for row in db.execute("PRAGMA table_info(turns)")}
    finally:
        db.close()
