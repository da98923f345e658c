"""The server's event bus: what `GET /admin/events` streams to the TUI.

`publish` may be called from any thread and any event loop (the runner's rollouts may live on their
own loop); each subscriber owns a bounded queue on its own loop. A subscriber that cannot keep up
loses its oldest events rather than growing without bound or slowing the capture path.

An event may be given as a function that builds it: it is called only when someone listens (each
turn's pydantic session summary cost a few percent of the proxy's CPU per call, for no one, when
no TUI or watcher was attached).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

QUEUE_LIMIT = 1000

_CLOSED: dict[str, Any] = {"type": "closed"}
"""Put in each subscriber's queue by `EventBus.close`: its iteration ends there."""


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _Subscriber:
    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=limit)
        self.dropped = 0

    def put(self, event: dict[str, Any]) -> None:
        """Runs on the subscriber's loop."""
        if self.queue.full():
            self.queue.get_nowait()
            self.dropped += 1
        self.queue.put_nowait(event)


class EventBus:
    """Fan-out of JSON-able event dicts to every live subscriber."""

    def __init__(self, limit: int = QUEUE_LIMIT) -> None:
        self._limit = limit
        self._subscribers: set[_Subscriber] = set()
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        """End every subscription, now and later (the server is shutting down: its event streams
        must end for it to stop without cancelling their requests)."""
        with self._lock:
            self._closed = True
            subscribers = list(self._subscribers)
        current = _running_loop()
        for sub in subscribers:
            self._deliver(sub, _CLOSED, current)

    def publish(self, event: dict[str, Any] | Callable[[], dict[str, Any]]) -> None:
        """Send an event (must carry a `"type"`) to every subscriber; never blocks, never raises.

        `event` may be a function returning the event: it is called only if there is a subscriber."""
        with self._lock:
            subscribers = list(self._subscribers)
        if not subscribers:
            return
        event = {"ts": time.time(), **(event() if callable(event) else event)}
        current = _running_loop()
        for sub in subscribers:
            self._deliver(sub, event, current)

    @staticmethod
    def _deliver(sub: _Subscriber, event: dict[str, Any], current: asyncio.AbstractEventLoop | None) -> None:
        if sub.loop is current:
            sub.put(event)
        elif not sub.loop.is_closed():
            try:
                sub.loop.call_soon_threadsafe(sub.put, event)
            except RuntimeError:
                # The loop closed between the check and the call: that subscriber is gone.
                pass

    @property
    def subscriber_count(self) -> int:
        """How many subscribers are attached (for tests and diagnostics)."""
        with self._lock:
            return len(self._subscribers)

    async def subscribe(self) -> AsyncGenerator[dict[str, Any], None]:
        """Yield events published after this call, until the consumer stops iterating or the bus
        is closed."""
        sub = _Subscriber(asyncio.get_running_loop(), self._limit)
        with self._lock:
            if self._closed:
                return
            self._subscribers.add(sub)
        try:
            while (event := await sub.queue.get()) is not _CLOSED:
                yield event
        finally:
            with self._lock:
                self._subscribers.discard(sub)
