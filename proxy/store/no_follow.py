"""No file tapdeck writes is written through a symbolic link.

A link planted where tapdeck creates, replaces, appends to or chmods a file (`admin.key` naming
another file, a dangling `capture.db-wal`) would make tapdeck overwrite, create or chmod whatever
the link names. So each such file refuses a link in its own place, dangling or not, with one line
naming it (`LinkRefused`). The folders above it may be links: a data dir symlinked to a bigger disk
is common, and only its owner can make one inside it (it is 0700).
"""

from __future__ import annotations

import errno
import os
from typing import TextIO

LINK_REFUSED = "it is a symbolic link (tapdeck writes no file through a link)"


class LinkRefused(OSError):
    """A file tapdeck would write is a symbolic link. `str()` is the line a user reads, the same
    as a command's one line for any OSError naming a file (`cannot use PATH: why`)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(errno.ELOOP, LINK_REFUSED, os.fspath(path))

    def __str__(self) -> str:
        return f"cannot use {self.filename}: {self.strerror}"


def refuse_link(path: str | os.PathLike[str]) -> None:
    """LinkRefused when `path` itself is a symbolic link (dangling or not)."""
    if os.path.islink(path):
        raise LinkRefused(path)


def open_no_follow(path: str | os.PathLike[str], flags: int, mode: int = 0o666) -> int:
    """`os.open` that refuses a link at `path` (LinkRefused). O_NOFOLLOW makes the open itself
    refuse it, so no link can slip in between a check and the open."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise LinkRefused(path) from None
        raise


def open_append(path: str | os.PathLike[str]) -> TextIO:
    """`path` opened to append UTF-8 text, created when missing; LinkRefused for a link."""
    return os.fdopen(open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", encoding="utf-8")


__all__ = ["LINK_REFUSED", "LinkRefused", "open_append", "open_no_follow", "refuse_link"]
