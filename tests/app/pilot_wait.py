"""Wait in a Pilot test for what the app does asynchronously (HTTP loads, timed refreshes)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(pilot, predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Let the app run until `predicate()` holds; fail naming `what` and the app's status after
    `timeout` seconds (a bound for a loaded machine, not a speed check)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            status = getattr(pilot.app, "status", None)
            raise AssertionError(f"timed out waiting for {what}; status: {status!r}")
        await pilot.pause(0.05)
