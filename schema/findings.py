"""Validation findings on the wire: `level`, `code`, `detail` and the turn they concern.

Rendered `[LEVEL] code: detail` for people (`str()`), always with the level in brackets so a scan
for `[FATAL` catches every fatal one; clients receive and keep the structured form.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, model_validator

_RENDERED = re.compile(r"^\[(FATAL|WARN|INFO)\] ([^:]*): ?(.*)$", re.DOTALL)


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

    @model_validator(mode="before")
    @classmethod
    def _from_stored_text(cls, data: Any) -> Any:
        """Run directories written before findings were structured hold them rendered; those are
        read back once here (nothing on the wire is text any more)."""
        if not isinstance(data, str):
            return data
        match = _RENDERED.match(data)
        if match is None:
            return {"level": Level.INFO, "code": "unparsed", "detail": data}
        return {"level": match[1], "code": match[2], "detail": match[3]}


def has_fatal(findings: list[Finding]) -> bool:
    """True when any finding is FATAL."""
    return any(f.level is Level.FATAL for f in findings)
