"""The runner's own event loop: a plain asyncio loop on a thread of its own.

The server's loop runs uvloop (its HTTP and the capture path cost less CPU per call there), but
Harbor trials cannot run on uvloop: a detached `tmux new-session` started with
`create_subprocess_exec` never reaches EOF on its pipes under uvloop, so terminus-2's setup hangs
until its timeout. Batches therefore run here, on asyncio, and cross to the server's loop only
for the capture service's coroutines (`open_session`, `close_session`: its engine connections and
session locks belong to that loop). The service's other methods are thread-safe and are called
directly, as the runner's worker threads already did.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

from tapdeck.runner.service_protocol import CaptureServiceProtocol

T = TypeVar("T")

STOP_GRACE_S = 10.0
"""How long tasks still on the loop at stop get to unwind after being cancelled."""


class RunnerLoop:
    """An asyncio loop on a daemon thread, started on first use."""

    def __init__(self, name: str = "tapdeck-runner") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started now if it was not)."""
        with self._lock:
            if self._loop is None:
                # A SelectorEventLoop by name: whatever event-loop policy the process has, trials
                # need the stdlib loop.
                loop = asyncio.SelectorEventLoop()
                ready = threading.Event()
                self._thread = threading.Thread(
                    target=self._serve, args=(loop, ready), name=self.name, daemon=True
                )
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> LoopTask[T]:
        """Run `coro` as a task on this loop; returns at once with a handle usable from any thread."""
        loop = self.loop
        if threading.current_thread() is self._thread:
            return LoopTask(loop.create_task(coro, name=name), loop)
        created: concurrent.futures.Future[asyncio.Task[T]] = concurrent.futures.Future()
        loop.call_soon_threadsafe(lambda: created.set_result(loop.create_task(coro, name=name)))
        return LoopTask(created.result(), loop)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` on this loop's thread, soon; does not wait."""
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self, timeout: float = STOP_GRACE_S + 2) -> None:
        """Cancel what still runs on the loop, let it unwind, and end the thread."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.wait(left, timeout=STOP_GRACE_S))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


class LoopTask[T]:
    """A task on another loop, seen from this one: `done()`, `cancel()`, and awaitable until it
    has really ended (a cancelled run still tears its sandboxes down before it ends)."""

    def __init__(self, task: asyncio.Task[T], loop: asyncio.AbstractEventLoop) -> None:
        self._task = task
        self._loop = loop

    def done(self) -> bool:
        """Whether the task has ended."""
        return self._task.done()

    def cancel(self) -> None:
        """Ask the task to cancel (on its own loop); returns at once."""
        self._loop.call_soon_threadsafe(self._task.cancel)

    def add_done_callback(self, fn: Callable[[asyncio.Task[T]], Any]) -> None:
        """Call `fn(task)` on the task's own loop once it has ended (ended already: soon)."""
        self._loop.call_soon_threadsafe(self._task.add_done_callback, fn)

    async def wait(self) -> T:
        """Until the task has ended: its result, or its error (its cancellation) raised. Cancelling
        the waiter leaves the task running."""
        if not self._task.done():
            ended = asyncio.run_coroutine_threadsafe(asyncio.wait({self._task}), self._loop)
            await asyncio.wrap_future(ended)
        return self._task.result()

    def __await__(self) -> Generator[Any, None, T]:
        return self.wait().__await__()


class ServiceOnItsLoop:
    """The capture service as the runner's loop sees it: its coroutines run on the service's own
    loop; every other attribute is the service's."""

    def __init__(self, service: CaptureServiceProtocol, loop: asyncio.AbstractEventLoop) -> None:
        self._service = service
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)

    async def _there(self, coro: Coroutine[Any, Any, T]) -> T:
        # Cancelling the waiter here cancels the coroutine there (run_coroutine_threadsafe chains it).
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def open_session(self, spec: Any) -> Any:
        """`CaptureService.open_session`, run on the service's loop."""
        return await self._there(self._service.open_session(spec))

    async def close_session(self, session_id: str) -> Any:
        """`CaptureService.close_session`, run on the service's loop."""
        return await self._there(self._service.close_session(session_id))


__all__ = ["LoopTask", "RunnerLoop", "ServiceOnItsLoop"]
