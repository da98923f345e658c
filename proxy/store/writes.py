"""Store writes off the event loop, on threads of their own.

A commit must never queue behind a slow admin read (the export of a long rollout) or a sandbox's
file copy in the loop's default pool, so every write to the capture store runs on this executor
and the default pool keeps the reads. A write SQLite cannot make (disk full, read-only file
system, a database locked past the busy timeout, a closed store) comes back as `StoreUnavailable`:
nothing of it was committed, and callers answer 503 so the harness may retry later.

The pool is a few threads on one C queue, each settling its caller's future on the caller's loop.
`loop.run_in_executor` costs far more per write (a concurrent Future with its condition variable,
a thread-count check, and a chained asyncio future), and it ran on every captured turn: the
hand-off cost about a tenth of the proxy's CPU per call at 16 sessions.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tapdeck.proxy.errors import ProxyError

T = TypeVar("T")

WRITE_THREADS = 4
"""Concurrent writers: the store group-commits whatever is queued, so a few threads let many
sessions share one fsync; more would only wait on SQLite's single write lock."""


class StoreUnavailable(ProxyError):
    """The store refused a write; nothing of it is on disk. Retryable: the fault (a full disk, a
    lock held too long) is the server's, and passes."""

    def __init__(self, reason: str) -> None:
        super().__init__(503, reason, kind="store_unavailable")
        self.reason = reason


def unavailable(exc: BaseException) -> StoreUnavailable | None:
    """The store fault `exc` stands for, or None when it is a bug to be raised as is."""
    if isinstance(exc, StoreUnavailable):
        return exc
    if isinstance(exc, sqlite3.OperationalError):
        # SQLITE_FULL, SQLITE_READONLY, SQLITE_BUSY/LOCKED, SQLITE_IOERR_*, SQLITE_CANTOPEN.
        name = getattr(exc, "sqlite_errorname", "") or "SQLITE_ERROR"
        return StoreUnavailable(f"{name}: {exc}")
    if isinstance(exc, OSError):
        return StoreUnavailable(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, RuntimeError) and "is closed" in str(exc):
        return StoreUnavailable(str(exc))
    return None


class StoreWrites:
    """A thread pool that runs only store writes (and the in-memory state they commit with)."""

    def __init__(self, threads: int = WRITE_THREADS) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"tapdeck-store-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()
        self._lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tapdeck-store-notes")
        """Writes nobody waits for (session annotations), run one at a time in submission order."""

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on a store thread; a store fault raises `StoreUnavailable`."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        try:
            if self._closed:  # no thread is left to run it: refused, never left waiting
                raise RuntimeError("the capture store's writer is closed")
            self._jobs.put((loop, done, fn, args, kwargs))
            return await done
        except Exception as exc:
            fault = unavailable(exc)
            if fault is None:
                raise
            raise fault from exc

    def _work(self) -> None:
        """A store thread: run jobs until the `None` that `shutdown` queues."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            _run(job)
            del job  # an idle thread must not keep its last job's arguments (a graph) alive

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` after the writes submitted before it, without waiting for it (`fn`
        handles its own errors)."""
        self._lane.submit(fn, *args)

    def submit_and_wait(self, fn: Callable[..., Any], *args: Any) -> None:
        """`submit`, then block until it has run: for a caller on a thread whose write must be
        durable when it returns, still in order with the writes submitted before it."""
        self._lane.submit(fn, *args).result()

    async def drain(self) -> None:
        """Until every write submitted so far has run."""
        await asyncio.get_running_loop().run_in_executor(self._lane, lambda: None)

    def shutdown(self) -> None:
        """Finish the writes already submitted, then stop the threads."""
        self._lane.shutdown(wait=True)
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()


_Job = tuple[
    asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]
]


def _run(job: _Job) -> None:
    """Run one job and settle its future on the caller's loop."""
    loop, done, fn, args, kwargs = job
    if done.cancelled():  # its caller gave up before it started: as a pool would, skip it
        return
    try:
        result, error = fn(*args, **kwargs), None
    except BaseException as exc:  # noqa: BLE001 - every outcome is handed to the caller's future
        result, error = None, exc
    try:
        loop.call_soon_threadsafe(_settle, done, result, error)
    except RuntimeError:  # the caller's loop has closed: nobody is waiting
        pass


def _settle(done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """On the caller's loop: hand over the outcome, unless the caller stopped waiting."""
    if done.cancelled():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)


__all__ = ["StoreUnavailable", "StoreWrites", "unavailable"]
