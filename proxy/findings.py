"""Validation findings: `[FATAL|WARN|INFO] code: detail`.

Always rendered with the level in brackets so a scan for `[FATAL` catches every fatal one.
"""

from __future__ import annotations

from tapdeck.schema.findings import Finding, Level

__all__ = ["Finding", "Level", "has_fatal"]


def has_fatal(findings: list[Finding]) -> bool:
    """True when any finding is FATAL."""
    return any(f.level is Level.FATAL for f in findings)
