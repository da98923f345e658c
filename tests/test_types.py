"""The type check: mypy over the `tapdeck` package with pyproject's [tool.mypy] (strict on schema/
and proxy/, basic elsewhere) finds no error.

The repo root is the package (pyproject maps `tapdeck` to "."), and mypy names modules after folders,
so mypy is pointed (MYPYPATH) at a folder holding one link, `tapdeck`, to this checkout. By hand:

    mkdir -p /tmp/typeroot && ln -sfn "$PWD" /tmp/typeroot/tapdeck
    MYPYPATH=/tmp/typeroot .venv/bin/python -m mypy

The link and mypy's cache live under ~/.cache/tapdeck/mypy, the same for every checkout: mypy keeps
each module's path in its cache, and checks a file whose time changed by its content, so a fresh
clone with unchanged files (CI's) rechecks only what changed. A lock keeps two checkouts' runs apart.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache" / "tapdeck" / "mypy"


def _package_root() -> Path:
    """The folder whose `tapdeck` links to this checkout (re-pointed when another checkout ran)."""
    root = CACHE / "root"
    root.mkdir(parents=True, exist_ok=True)
    link = root / "tapdeck"
    if not (link.is_symlink() and link.resolve() == ROOT):
        tmp = root / f"tapdeck.{os.getpid()}"
        tmp.symlink_to(ROOT, target_is_directory=True)
        os.replace(tmp, link)
    return root


def test_mypy_finds_no_error() -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        root = _package_root()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "mypy",
                "--config-file",
                str(ROOT / "pyproject.toml"),
                "--cache-dir",
                str(CACHE / "cache"),
            ],
            cwd=ROOT,
            env={**os.environ, "MYPYPATH": str(root)},
            capture_output=True,
            text=True,
            timeout=900,
        )
    # Paths as in the checkout, not through the link.
    report = (out.stdout + out.stderr).replace(str(root / "tapdeck"), str(ROOT))
    assert out.returncode == 0, report
    assert "Success: no issues found" in report, report
