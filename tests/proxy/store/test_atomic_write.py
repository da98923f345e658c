"""A file replaced whole or not at all (proxy/store/atomic_write.py), as every file tapdeck replaces."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tapdeck.proxy.store.atomic_write import atomic_write


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _temporaries(folder: Path, target: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p != target]


@pytest.fixture
def open_umask():
    """No umask, so a mode the umask would have narrowed shows as it was asked for."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_a_private_file_is_owner_only_from_its_temporary_file_on_even_over_a_readable_one(
    tmp_path: Path, open_umask
) -> None:
    target = tmp_path / "secret"
    target.write_text("old\n")
    target.chmod(0o644)
    with atomic_write(target, mode=0o600) as f:
        [temp] = _temporaries(tmp_path, target)  # before a byte is written
        assert _mode(temp) == 0o600
        f.write(b"new\n")
    assert target.read_text() == "new\n" and _mode(target) == 0o600
    assert _temporaries(tmp_path, target) == []


def test_without_a_mode_the_new_file_keeps_the_old_ones(tmp_path: Path, open_umask) -> None:
    target = tmp_path / "shared"
    target.write_text("old\n")
    target.chmod(0o640)
    with atomic_write(target) as f:
        f.write(b"new\n")
    assert target.read_text() == "new\n" and _mode(target) == 0o640


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    target = tmp_path / "kept"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_write(target) as f:
        f.write(b"half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old\n" and _temporaries(tmp_path, target) == []
