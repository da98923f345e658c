"""Files into and out of a host-sandbox trial: where a sandbox path lives on the host, and copies.

A path under a bound directory (the workdir, `/logs`, `/tests`, `/tmp`, ...) lives in that path's
per-trial host directory; any other path is reached through `/proc/<holder>/root`, the trial's own
view (which for such paths is the real host filesystem).
"""

from __future__ import annotations

import posixpath
import shutil
from pathlib import Path


def host_path(sandbox_path: str, *, workdir: str, binds: dict[str, Path], holder_pid: int) -> Path:
    """Where `sandbox_path` (relative ones from `workdir`) lives on the host."""
    path = posixpath.normpath(posixpath.join(workdir, sandbox_path))
    best = max(
        (t for t in binds if path == t or path.startswith(t.rstrip("/") + "/")),
        key=len,
        default=None,
    )
    if best is None:
        return Path(f"/proc/{holder_pid}/root") / path.lstrip("/")
    return binds[best] / posixpath.relpath(path, best)


def copy_file(source: Path | str, target: Path | str) -> None:
    """Copy one file (with its metadata), making the target's parents."""
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def copy_dir(source: Path | str, target: Path | str) -> None:
    """Copy a directory's contents into `target` (symlinks as links; existing files overwritten)."""
    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)


__all__ = ["copy_dir", "copy_file", "host_path"]
