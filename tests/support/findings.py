"""Findings from an API reply as `[LEVEL] code: detail` lines, for matching in assertions."""

from __future__ import annotations

from typing import Any

from tapdeck.schema.findings import Finding


def rendered(findings: list[dict[str, Any]]) -> list[str]:
    """Each structured finding rendered the way people read it (the reply itself keeps them structured)."""
    return [str(Finding.model_validate(f)) for f in findings]
