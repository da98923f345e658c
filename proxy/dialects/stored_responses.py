"""Responses API conversation state: what `previous_response_id` refers to, per session, in memory.

A client may send only its new input items and name the response they follow; the proxy then
rebuilds the whole input (every earlier call's input items and output items, in order) before
translating, so the engine sees exactly what a client resending its history would have sent and
the call links into the same rollout chain. As in OpenAI's API, the earlier `instructions` are not
carried over, and a response made with `store: false` cannot be referred to.

Each stored response keeps only its own new input items and its output items, plus the id it
followed: memory grows with the items, not with turns². Responses live while their session is
open and at most `MAX_RESPONSES` per session, least recently used first out (an unknown or evicted
id, or one from before a restart, is a clear 400). A chain is walked with a guard, so a stored
response can never send the walk round in a loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tapdeck.proxy.dialects.base import DialectError

MAX_RESPONSES = 2048
"""Stored responses per session: far above a rollout's call budget, low enough that a client
storing every reply of an endless session cannot grow the server without bound."""


@dataclass(frozen=True)
class _Stored:
    previous: str | None
    input: list[Any]
    output: list[Any]


def _input_items(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        return list(value)
    raise DialectError(400, "input must be a string or a list of items", param="input")


class StoredResponses:
    """One session's stored responses, by id. Not thread-safe: used on the event loop."""

    def __init__(self, limit: int = MAX_RESPONSES) -> None:
        self._limit = limit
        self._by_id: OrderedDict[str, _Stored] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_id)

    def expand(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """`body` with its `input` made the full input `previous_response_id` stands for.

        Raises DialectError(400) naming the id when it is unknown to this session.
        """
        out = dict(body)
        previous = out.get("previous_response_id")
        if not previous:
            return out
        if not isinstance(previous, str) or previous not in self._by_id:
            raise DialectError(
                400,
                f"previous response {previous!r} is not known to this session: tapdeck keeps "
                "responses made with store=true in memory until the server restarts; send the "
                "full conversation as input instead",
                param="previous_response_id",
            )
        chain: list[_Stored] = []
        seen: set[str] = set()
        at: str | None = previous
        while at is not None and at not in seen:
            stored = self._by_id.get(at)
            if stored is None:
                raise DialectError(
                    400,
                    f"previous response {previous!r} follows {at!r}, which this session no "
                    f"longer keeps (at most {self._limit} responses are kept); send the full "
                    "conversation as input instead",
                    param="previous_response_id",
                )
            seen.add(at)
            self._by_id.move_to_end(at)  # a chain in use stays
            chain.append(stored)
            at = stored.previous
        history: list[Any] = []
        for stored in reversed(chain):
            history += stored.input
            history += stored.output
        out["input"] = history + _input_items(body.get("input"))
        return out

    def remember(self, body: Mapping[str, Any], response: Mapping[str, Any]) -> None:
        """Keep a rendered `response` to the original request `body`, unless `store` was false."""
        if body.get("store") is False or not isinstance(response.get("id"), str):
            return
        previous = body.get("previous_response_id")
        rid = response["id"]
        self._by_id[rid] = _Stored(
            previous=previous
            if isinstance(previous, str) and previous in self._by_id and previous != rid
            else None,
            input=_input_items(body.get("input")),
            output=list(response.get("output") or []),
        )
        self._by_id.move_to_end(rid)
        while len(self._by_id) > self._limit:
            self._by_id.popitem(last=False)
