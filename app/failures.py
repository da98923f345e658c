"""The failures of the world around a command (a server that does not answer, a path that cannot
be used, a corrupt store) as the one line a user reads, instead of a traceback.

Anything not recognised here is a bug in tapdeck and keeps its traceback.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


def describe(exc: BaseException) -> str | None:
    """One line saying what went wrong, or None when `exc` is not a known failure kind."""
    from tapdeck.app.client import ApiError

    if isinstance(exc, BaseExceptionGroup):
        # anyio/httpx wrap a failed connect in a group; a group holding any bug keeps its traceback.
        lines = [describe(inner) for inner in exc.exceptions]
        return None if None in lines else lines[0]
    if isinstance(exc, ApiError):
        return exc.message
    if isinstance(exc, sqlite3.DatabaseError):
        return f"a SQLite file is not a tapdeck store or is corrupt ({exc})"
    if isinstance(exc, FileExistsError) and exc.filename is not None:
        # What mkdir(exist_ok=True) raises when a file stands where a directory is wanted.
        return f"cannot use {exc.filename}: it exists and is not a directory"
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"cannot use {exc.filename}: {exc.strerror or exc}"
    return None


def validation_line(exc: ValidationError) -> str:
    """A pydantic validation error of settings given as flags, as one line: each wrong flag and
    why, without pydantic's links and input dumps."""
    parts = []
    for error in exc.errors():
        why = str(error.get("ctx", {}).get("error") or error["msg"])
        flag = "--" + "-".join(str(p) for p in error["loc"]).replace("_", "-")
        parts.append(f"{flag}: {why}" if error["loc"] else why)
    return "; ".join(parts)
