"""Validation findings: `[FATAL|WARN|INFO] code: detail`.

Always rendered with the level in brackets so a scan for `[FATAL` catches every fatal one.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel


class Level(StrEnum):
    """How bad a finding is. FATAL makes the turn untrainable and the rollout not ok."""

    FATAL = "FATAL"
    WARN = "WARN"
    INFO = "INFO"


class Finding(BaseModel, frozen=True):
    """One validation result, attached to a turn, a sequence or a rollout."""

    level: Level
    code: str
    detail: str = ""
    turn: int | None = None
    """Arrival index of the turn it concerns, when it concerns one."""

    def __str__(self) -> str:
        return f"[{self.level}] {self.code}: {self.detail}"

    @classmethod
    def fatal(cls, code: str, detail: str = "", turn: int | None = None) -> Finding:
        return cls(level=Level.FATAL, code=code, detail=detail, turn=turn)

    @classmethod
    def warn(cls, code: str, detail: str = "", turn: int | None = None) -> Finding:
        return cls(level=Level.WARN, code=code, detail=detail, turn=turn)

    @classmethod
    def info(cls, code: str, detail: str = "", turn: int | None = None) -> Finding:
        return cls(level=Level.INFO, code=code, detail=detail, turn=turn)


def has_fatal(findings: list[Finding]) -> bool:
    """True when any finding is FATAL."""
    return any(f.level is Level.FATAL for f in findings)
