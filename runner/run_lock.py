"""Which process runs a run: a `flock` on `runs/<id>/run.lock`, held while the run executes.

A run's `state.json` says `running` from its start to its end, also after its process died. Two
processes may serve one data dir (a `tapdeck serve` and a local `tapdeck rollout --resume`, or two
servers), so "running, but not here" means either "interrupted" or "running in that other process".
The lock tells them apart: the kernel drops it with the process, so no stale pid is ever believed.
The holder writes its pid into the file, for the message that names it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from tapdeck.proxy.store.no_follow import open_no_follow

LOCK_FILE = "run.lock"


class RunLock:
    """The lock of the run whose folder is `run_dir`, claimed by this process or not."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def claim(self) -> int | None:
        """Take the lock (a no-op when held already); None once held, else the pid of the process
        that holds it (0 when it wrote none yet)."""
        if self._fd is not None:
            return None
        fd = open_no_follow(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return self.holder() or 0
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return None

    def release(self) -> None:
        """Let the lock go (safe when not held)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def holder(self) -> int | None:
        """The pid of another process that runs the run now, or None when none does."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.pread(fd, 32, 0).decode(errors="replace").strip()
                return int(text) if text.isdigit() else 0
            return None
        finally:
            os.close(fd)
