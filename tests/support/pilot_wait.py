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


async def click_until(
    pilot,
    widget: type,
    offset: tuple[int, int],
    predicate: Callable[[], bool],
    what: str,
    timeout: float = 30.0,
) -> None:
    """Click `widget` at `offset` until `predicate()` holds. A widget whose content was just
    replaced is laid out a frame or more later, so a click in between lands on the old layout
    (empty space, or the previous text): clicking again once it settles is what a person does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        await pilot.click(widget, offset=offset)
        for _ in range(4):
            await pilot.pause(0.05)
            if predicate():
                return
        if loop.time() > deadline:
            status = getattr(pilot.app, "status", None)
            raise AssertionError(f"timed out waiting for {what}; status: {status!r}")
