"""The last few graphs of sessions that are no longer live, kept for the reads that follow.

Opening a rollout in the TUI asks for its graph, then its findings and turns: each read of a
closed or restarted session rebuilt the whole graph from the store (160-350 ms for 500 turns on
two idle cores, more under load). A closed session's turns do not change, and the one change made
to its graph after the fact (demoting calls to auxiliary) is made on the graph these reads share.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from tapdeck.proxy.capture.graph import RolloutGraph

KEPT_GRAPHS = 4
"""How many: the rollouts an operator flips between, without holding a long run's every graph."""


class KeptGraphs:
    """A bounded, thread-safe map of session id → graph; the least recently used goes first."""

    def __init__(self, size: int = KEPT_GRAPHS) -> None:
        self._size = size
        self._graphs: OrderedDict[str, RolloutGraph] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session_id: str) -> RolloutGraph | None:
        """The kept graph of `session_id`, now the most recently used; None when not kept."""
        with self._lock:
            graph = self._graphs.get(session_id)
            if graph is not None:
                self._graphs.move_to_end(session_id)
            return graph

    def keep(self, session_id: str, graph: RolloutGraph) -> None:
        """Keep `graph`, dropping the least recently used past the bound."""
        with self._lock:
            self._graphs[session_id] = graph
            self._graphs.move_to_end(session_id)
            while len(self._graphs) > self._size:
                self._graphs.popitem(last=False)

    def drop(self, session_id: str) -> None:
        """Forget `session_id`'s graph (it is live again, or must be rebuilt)."""
        with self._lock:
            self._graphs.pop(session_id, None)
