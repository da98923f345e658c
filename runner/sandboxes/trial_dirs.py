"""A host sandbox trial's folder on the host, and the removal of those a dead process left behind.

Each trial's per-trial directories live in one `tapdeck-host-*` folder under a base dir (the
system temp dir by default). The process running the trial holds an exclusive `flock` on
`owner.lock` inside it for as long as the trial lives; the kernel drops that lock when the process
dies, however it dies. A `kill -9` (or a crash) of the process running trials therefore leaves
folders whose lock anyone can take, and the next trial started under the same base dir removes them.
A folder without `owner.lock` is left alone: it is either still being made, or kept on purpose
(`stop(delete=False)`), or older than this scheme.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "tapdeck-host-"
LOCK = "owner.lock"


class TrialDir:
    """One trial's folder, locked by this process until `remove` or `keep`."""

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self._lock_fd: int | None = lock_fd

    @classmethod
    def make(cls, base_dir: Path | None) -> TrialDir:
        """A fresh folder under `base_dir` (None: the system temp dir), locked by this process."""
        path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base_dir))
        path.chmod(0o755)
        # Locked before it takes its name, so a sweep never finds a live trial's lock free.
        pending = path / f".{LOCK}.new"
        fd = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(pending, path / LOCK)
        return cls(path, fd)

    def remove(self) -> None:
        """Delete the folder and everything in it, then drop the lock."""
        shutil.rmtree(self.path, ignore_errors=True)
        self._unlock()

    def keep(self) -> None:
        """Leave the folder in place for good: no later sweep removes it."""
        with contextlib.suppress(FileNotFoundError):
            (self.path / LOCK).unlink()
        self._unlock()

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)


def remove_abandoned(base_dir: Path | None) -> list[Path]:
    """Remove the trial folders under `base_dir` whose owner died; returns them.

    Never blocks: a folder whose lock is held (its trial lives) or that another sweep is removing
    is skipped.
    """
    base = base_dir or Path(tempfile.gettempdir())
    removed = []
    for folder in base.glob(f"{PREFIX}*"):
        lock = folder / LOCK
        try:
            fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # no lock (being made, kept, or not ours), or not readable by this user
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its trial is alive
            # The lock taken must still be the folder's: another sweep may have removed the folder
            # (and a new trial made one of the same name) while this one waited to open it.
            try:
                same = os.fstat(fd).st_ino == os.stat(lock, follow_symlinks=False).st_ino
            except OSError:
                same = False
            if same:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
        finally:
            os.close(fd)
    return removed
