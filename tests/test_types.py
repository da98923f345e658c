"""The type check: mypy over the `tapdeck` package with pyproject's [tool.mypy] (strict on schema/
and proxy/, basic elsewhere) finds no error.

The repo root is the package (pyproject maps `tapdeck` to "."), and mypy names modules after folders,
so mypy is pointed (MYPYPATH) at a folder holding one link, `tapdeck`, to this checkout. By hand:

    mkdir -p /tmp/typeroot && ln -sfn "$PWD" /tmp/typeroot/tapdeck
    MYPYPATH=/tmp/typeroot .venv/bin/python -m mypy

The cache stays in the checkout's .mypy_cache (ignored), so a warm run rechecks only what changed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _package_root() -> Path:
    """A folder whose `tapdeck` links to this checkout, the same one every run: mypy's cache
    keeps each module's path, and reports a cached module's errors under it."""
    key = hashlib.sha256(str(ROOT).encode()).hexdigest()[:16]
    root = Path(tempfile.gettempdir()) / f"tapdeck-mypy-{key}"
    root.mkdir(exist_ok=True)
    link = root / "tapdeck"
    if not link.is_symlink():
        link.symlink_to(ROOT, target_is_directory=True)
    return root


def test_mypy_finds_no_error() -> None:
    root = _package_root()
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")],
        cwd=ROOT, env={**os.environ, "MYPYPATH": str(root)}, capture_output=True, text=True, timeout=900,
    )
    # Paths as in the checkout, not through the link.
    report = (out.stdout + out.stderr).replace(str(root / "tapdeck"), str(ROOT))
    assert out.returncode == 0, report
    assert "Success: no issues found" in report, report
