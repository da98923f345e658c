"""The tree passes its linters (import contracts, ruff) and the suite fails on tapdeck's deprecations."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    # The tools come with the test extra, installed beside the interpreter running the suite.
    exe = Path(sys.executable).parent / tool
    assert exe.exists(), f"{exe} is missing: install tapdeck's test extra"
    return subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_imports_keep_the_layering_contracts() -> None:
    # No cache: it would be written into the repo, and a stale one could hide a new import.
    done = _run("lint-imports", "--no-cache", "--no-logo")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("args", [("check", "."), ("format", "--check", ".")], ids=["check", "format"])
def test_ruff_finds_nothing(args: tuple[str, ...]) -> None:
    done = _run("ruff", *args)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("category", [DeprecationWarning, PendingDeprecationWarning])
def test_a_deprecation_raised_from_tapdecks_code_fails_the_test(category: type[Warning]) -> None:
    # Under pyproject's filterwarnings, as every test runs; attributed to a tapdeck module, as a
    # warning raised there (or blamed there by its stacklevel) is.
    with pytest.raises(category):
        warnings.warn_explicit("old API", category, "proxy/config.py", 1, module="tapdeck.proxy.config")
