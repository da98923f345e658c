"""A turn's policy version stamp, and the span of versions a rollout's turns were sampled with.

Where the readings come from is `proxy/upstream/policy_versions.py`; a stamp keeps both readings
(before and after the call): equal, they are the turn's version; different, the turn straddled a
weight update and has no one version.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from tapdeck.schema.findings import Finding
from tapdeck.schema.sessions import PolicySource, PolicySpan, PolicyVersion

MAX_LABEL_CHARS = 200
"""The longest version label kept (an engine's label is free text)."""


def policy_version(value: Any) -> PolicyVersion | None:
    """A version as read from an engine or a trainer: an int (≥ 0), a label of digits as its
    number, another label as is; None for anything else (null, a bool, a float, an empty label)."""
    if type(value) is int:
        return value if value >= 0 else None
    if type(value) is str and (label := value.strip()) and len(label) <= MAX_LABEL_CHARS:
        return int(label) if label.isascii() and label.isdigit() else label
    return None


class PolicyStamp(NamedTuple):
    """Which weights sampled one call: the readings before and after it, and their source."""

    source: PolicySource
    before: PolicyVersion | None
    after: PolicyVersion | None

    @property
    def version(self) -> PolicyVersion | None:
        """The one version that sampled the call; None when it straddled an update."""
        return self.before if self.before == self.after else None

    @property
    def straddled(self) -> tuple[PolicyVersion | None, PolicyVersion | None] | None:
        """(before, after) when the weights changed while the call was in flight."""
        return None if self.before == self.after else (self.before, self.after)

    def finding(self) -> Finding | None:
        """A WARN for a straddling call: part of its tokens may come from either version."""
        if self.straddled is None:
            return None
        return Finding.warn(
            "policy_version_straddled",
            f"the weights changed while this call was in flight: version {self.before} when it "
            f"was sent, {self.after} when it was answered ({self.source}); no one version sampled it",
        )

    def fields(self) -> dict[str, Any]:
        """`policy_version` and, where it applies, `policy_version_straddled`: as exported."""
        out: dict[str, Any] = {"policy_version": self.version}
        if (pair := self.straddled) is not None:
            out["policy_version_straddled"] = list(pair)
        return out


def _first(stamp: PolicyStamp) -> PolicyVersion | None:
    return stamp.before if stamp.before is not None else stamp.after


def _last(stamp: PolicyStamp) -> PolicyVersion | None:
    return stamp.after if stamp.after is not None else stamp.before


class SpanTally:
    """The span of a rollout's stamps, kept as its turns arrive in order (O(1) per turn)."""

    __slots__ = ("newest", "oldest", "straddled")

    def __init__(self) -> None:
        self.oldest: PolicyVersion | None = None
        self.newest: PolicyVersion | None = None
        self.straddled = 0

    def add(self, stamp: PolicyStamp | None) -> None:
        """Count the next turn's stamp (None: an unstamped turn, which changes nothing)."""
        if stamp is None:
            return
        if self.oldest is None:
            self.oldest = _first(stamp)
        self.newest = _last(stamp) if _last(stamp) is not None else self.newest
        self.straddled += stamp.straddled is not None

    def span(self) -> PolicySpan | None:
        """The span so far; None before any turn was stamped with a version."""
        if self.oldest is None or self.newest is None:
            return None
        return PolicySpan(oldest=self.oldest, newest=self.newest, straddled=self.straddled)


def policy_span(stamps: Iterable[PolicyStamp | None]) -> PolicySpan | None:
    """The span of a rollout's turn stamps, in arrival order."""
    tally = SpanTally()
    for stamp in stamps:
        tally.add(stamp)
    return tally.span()


__all__ = ["PolicyStamp", "SpanTally", "policy_span", "policy_version"]
