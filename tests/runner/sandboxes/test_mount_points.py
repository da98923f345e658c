"""Host mount points: made when missing, shared by concurrent trials, removed by the last one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tapdeck.runner.sandboxes.mount_points import MountPoints


def test_the_last_user_removes_the_directories_it_made_and_nothing_else(tmp_path: Path) -> None:
    state, kept = tmp_path / "state", tmp_path / "kept"
    kept.mkdir()
    made = [str(tmp_path / "app" / "proj"), str(kept / "logs")]
    first, second = MountPoints(state), MountPoints(state)
    first.claim(made)
    second.claim(made)
    assert all(Path(p).is_dir() for p in made)
    assert first.release() == []  # the second trial still binds over them
    assert all(Path(p).is_dir() for p in made)
    assert sorted(second.release()) == sorted([*made, str(tmp_path / "app")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "state"]
    assert list(kept.iterdir()) == []


def test_a_mount_point_that_gained_files_is_left_in_place(tmp_path: Path) -> None:
    claim = MountPoints(tmp_path / "state")
    claim.claim([str(tmp_path / "app")])
    (tmp_path / "app" / "note").write_text("the user put this here")
    assert claim.release() == []
    assert (tmp_path / "app" / "note").exists()


def test_a_trial_in_another_process_keeps_the_mount_points(tmp_path: Path) -> None:
    state, app = tmp_path / "state", str(tmp_path / "app")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, pathlib\n"
            "from tapdeck.runner.sandboxes.mount_points import MountPoints\n"
            f"m = MountPoints(pathlib.Path({str(state)!r})); m.claim([{app!r}])\n"
            "print('claimed', flush=True); sys.stdin.readline(); m.release()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "claimed"
        mine = MountPoints(state)
        mine.claim([app])
        assert mine.release() == []
        assert Path(app).is_dir()
    finally:
        holder.communicate("\n", timeout=30)
    assert not Path(app).exists()  # the other process was the last user
