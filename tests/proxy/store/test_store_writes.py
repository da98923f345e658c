"""The store's write threads: results and faults reach the caller's loop, writes share commits,
a caller that gave up before its write started gets it skipped, and shutdown finishes what is queued."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest

from tapdeck.proxy.store.database import Store
from tapdeck.proxy.store.writes import StoreUnavailable, StoreWrites


async def test_write_result_and_store_fault_reach_the_caller(tmp_path):
    writes = StoreWrites()
    store = Store(tmp_path / "capture.db")
    try:
        await writes.run(store.create_session, {"id": "s1", "created_at": 1.0})
        record = await writes.run(store.update_session, "s1", state="closed")
        assert record["state"] == "closed" and store.get_session("s1")["state"] == "closed"
        with pytest.raises(KeyError):  # a bug-shaped error is raised as it is
            await writes.run(store.update_session, "nope", state="x")

        def refused() -> None:
            raise sqlite3.OperationalError("database or disk is full")

        with pytest.raises(StoreUnavailable, match="disk is full"):
            await writes.run(refused)
    finally:
        writes.shutdown()
        store.close()


async def test_concurrent_writes_share_commits(tmp_path):
    writes = StoreWrites()
    store = Store(tmp_path / "capture.db")
    hold = threading.Event()
    try:
        # One write holds the store's write lock; the ones queued meanwhile commit together.
        first = asyncio.ensure_future(writes.run(store._write, lambda db: hold.wait(10)))
        while not store._write_lock.locked():
            await asyncio.sleep(0.001)
        rest = [asyncio.ensure_future(writes.run(store.create_session, {"id": f"s{i}"})) for i in range(3)]
        while store.queued < 3:
            await asyncio.sleep(0.001)
        before = store.commits
        hold.set()
        await asyncio.gather(first, *rest)
        assert store.commits - before == 2  # the held write's group, then one for the three
        assert {r["id"] for r in store.list_sessions()} == {"s0", "s1", "s2"}
    finally:
        hold.set()
        writes.shutdown()
        store.close()


async def test_write_cancelled_before_it_started_is_skipped():
    writes = StoreWrites(threads=1)
    hold, ran = threading.Event(), []
    try:
        busy = asyncio.ensure_future(writes.run(hold.wait, 10))  # the one thread waits in it
        await asyncio.sleep(0)
        queued = asyncio.ensure_future(writes.run(ran.append, "queued"))
        await asyncio.sleep(0)
        queued.cancel()
        hold.set()
        await busy
        assert await writes.run(ran.append, "after") is None
        assert ran == ["after"] and queued.cancelled()
    finally:
        hold.set()
        writes.shutdown()


def test_shutdown_finishes_the_writes_already_queued():
    writes = StoreWrites(threads=2)
    done: list[int] = []

    async def queue_and_leave() -> None:
        for i in range(20):
            writes._jobs.put(
                (
                    asyncio.get_running_loop(),
                    asyncio.get_running_loop().create_future(),
                    done.append,
                    (i,),
                    {},
                )
            )

    asyncio.run(queue_and_leave())  # their loop is closed by the time they run: nobody waits
    writes.shutdown()
    assert sorted(done) == list(range(20))


async def test_write_after_shutdown_is_refused_as_store_unavailable():
    writes = StoreWrites(threads=1)
    writes.shutdown()
    with pytest.raises(StoreUnavailable, match="writer is closed"):
        await writes.run(lambda: None)
