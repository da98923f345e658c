"""A person's check: the installed `tapdeck` in a real terminal (tmux), driven by keystrokes only."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess

import pytest

from tests.support.session_env import shell_assignments
from tests.support.tapdeck_process import TAPDECK
from tests.support.tmux_driver import Tmux, exit_code

pytestmark = [
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
    pytest.mark.skipif(not TAPDECK.exists(), reason="needs the installed tapdeck console script"),
]


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.medium
def test_tapdeck_runs_a_rollout_by_keystrokes_and_quits_freeing_the_port(tmp_path):
    name = f"tapdeck-test-{os.getpid()}"
    rc_file = tmp_path / "rc"
    data_dir = tmp_path / "data"
    command = (
        f"env TAPDECK_DATA_DIR={data_dir} {shell_assignments()} {TAPDECK}; echo $? > {rc_file}; sleep 60"
    )
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "100", "-y", "30", command], check=True)
    tmux = Tmux(name)
    try:
        tmux.wait_for(r"connected to embedded http://127\.0\.0\.1:\d+", 120)
        tmux.keys("5")
        info = tmux.wait_for(r"server embedded http://127\.0\.0\.1:(\d+)", 60)
        port = int(re.search(r"server embedded http://127\.0\.0\.1:(\d+)", info)[1])
        tmux.keys("1")
        tmux.wait_for(r"✓ sample", 120)  # catalog loaded; the dataset picker has focus
        # Harness: Tab to it, open it, pick the next entry (oracle: runs the task's solution).
        tmux.keys("Tab", "Tab", "Enter", "Down", "Enter")
        tmux.wait_for(r"✓ oracle", 60)
        # Tasks list (after sandbox, engine, public URL, K, concurrency, alternatives, Start): its
        # first row is highlighted on arrival; tick the third.
        tmux.keys(*["Tab"] * 8, "Down", "Down", "Space")
        tmux.wait_for(r"Tasks \(1 of 5 ticked\)", 30)
        tmux.keys("C-s")
        screen = tmux.wait_for(r"hello-file\s+finished", 120)
        assert "1 session · 1 finished" in screen
        tmux.keys("4")
        tmux.wait_for(r"hello-file\s+1/1", 60)
        tmux.keys("q")
        assert exit_code(rc_file) == "0", tmux.screen()
        assert _port_is_free(port)
        assert "Traceback" not in tmux.screen()
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
