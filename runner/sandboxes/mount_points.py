"""Empty host directories the host sandbox binds over, made when missing and removed by the last user.

A bind mount needs an existing directory on the host (`/app`, `/logs`, ...). Trials in any number
of processes share them, so each trial holds a shared `flock` on one lock file for its lifetime;
a trial that ends and can take the lock exclusively is the last user, and removes the directories
the sandbox created (only if still empty). Removing one while another trial still binds over it
would detach that trial's mount, hence the lock.

Left behind: the lock file and the list of created directories in `/run/tapdeck-host` (a tmpfs on
most systems, emptied at boot).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from tapdeck.proxy.store.no_follow import open_append, open_no_follow

STATE_DIR = Path("/run/tapdeck-host")
_LOCK = "users.lock"
_CREATED = "created"


class MountPoints:
    """One trial's claim on the host mount points (`claim`, then `release` exactly once)."""

    def __init__(self, state_dir: Path = STATE_DIR) -> None:
        self.state_dir = state_dir
        self._fd: int | None = None

    def claim(self, paths: list[str]) -> None:
        """Take a shared claim, then create whichever of `paths` (and their parents) are missing.

        Blocks only while a last user is removing directories.
        """
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = open_no_follow(self.state_dir / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._fd = fd
        made: list[str] = []
        for path in paths:
            missing = []
            for parent in [Path(path), *Path(path).parents]:
                if parent.exists():
                    break
                missing.append(parent)
            for directory in reversed(missing):
                with contextlib.suppress(FileExistsError):
                    directory.mkdir()
                    made.append(str(directory))
        if made:
            # One O_APPEND write per claim: concurrent claims never interleave their lines.
            with open_append(self.state_dir / _CREATED) as record:
                record.write("".join(f"{d}\n" for d in made))

    def release(self) -> list[str]:
        """Drop the claim; as the last user, remove the empty directories made. Returns them."""
        fd, self._fd = self._fd, None
        if fd is None:
            return []
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return []  # another trial still binds over them
            return self._remove_created()
        finally:
            os.close(fd)

    def _remove_created(self) -> list[str]:
        record = self.state_dir / _CREATED
        try:
            made = set(record.read_text().splitlines())
        except FileNotFoundError:
            return []
        removed = []
        for directory in sorted(made, key=lambda d: d.count("/"), reverse=True):
            with contextlib.suppress(OSError):  # gone already, or no longer empty: leave it
                os.rmdir(directory)
                removed.append(directory)
        record.unlink()
        return removed
