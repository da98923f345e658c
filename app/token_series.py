"""A turn's per-token series for the Rollout screen's sparklines, free of Textual.

Logprobs as the engine reported them; entropy over the captured alternatives only (a lower bound
of the true entropy, and none at all when the run captured no alternatives).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tapdeck.schema.sessions import TurnDetail


def logprob_series(turn: TurnDetail) -> list[float]:
    """Each sampled token's logprob; a token without one (masked) counts as 0 (no surprise shown)."""
    return [lp if lp is not None else 0.0 for lp in turn.logprobs or []]


def entropy_series(turn: TurnDetail) -> list[float]:
    """Per token, −Σ p·log p over its captured top alternatives (nats); [] without alternatives."""
    tops: Sequence[Sequence[tuple[str, float]]] = turn.top_logprobs or []
    if not any(tops):
        return []
    return [-sum(math.exp(lp) * lp for _, lp in alternatives if math.isfinite(lp)) for alternatives in tops]
