"""An engine that refuses calls while it updates its weights: waited out, within a bound.

A trainer syncing weights into vLLM either pauses it in `keep` mode (calls in flight and new ones
are frozen until it resumes: to the proxy just a slow reply, which it neither times out nor
retries) or has it refuse meanwhile with a 503 (vLLM's elastic-EP reconfiguration, Relax during a
weight update). A 503 means the engine did none of the work, so sending the same body again
cannot duplicate a turn: `through_update` resends it until the engine serves or `wait_s` has
passed, and then lets the caller have the engine's 503.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from tapdeck.proxy.upstream.client import EngineError

UPDATING_STATUS = 503
FIRST_RETRY_S = 0.1
RETRY_CAP_S = 2.0
"""Waits between resends double from FIRST_RETRY_S up to this: an engine back from a short sync is
used within a fraction of a second, and one still updating is asked at most every 2 s."""


async def through_update[T](
    send: Callable[[], Awaitable[T]], wait_s: float, waiting: Callable[[bool], None]
) -> T:
    """`send()`'s result, resending it while the engine answers 503, for at most `wait_s` seconds.

    `waiting(True)` is called when the first 503 comes back and `waiting(False)` once the call
    stops waiting (served, refused otherwise, out of time or cancelled). Past `wait_s` the
    EngineError carries the engine's 503 rather than the proxy's 502, saying how long it waited.
    """
    deadline: float | None = None
    pause = FIRST_RETRY_S
    try:
        while True:
            try:
                return await send()
            except EngineError as exc:
                if exc.upstream_status != UPDATING_STATUS:
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + wait_s
                    waiting(True)
                if now >= deadline:
                    raise EngineError(
                        "upstream_5xx",
                        UPDATING_STATUS,
                        f"{exc.message} (tapdeck resent the call for {wait_s:g} s while the engine "
                        "refused it: tapdeck serve --engine-update-wait)",
                        exc.url,
                        upstream_status=UPDATING_STATUS,
                    ) from None
                await asyncio.sleep(min(pause, deadline - now))
                pause = min(pause * 2, RETRY_CAP_S)
    finally:
        if deadline is not None:
            waiting(False)


__all__ = ["UPDATING_STATUS", "through_update"]
