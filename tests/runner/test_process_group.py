"""The process-group kill that the installer, the host sandbox and training share: a group is gone
once nothing in it runs, and a zombie nobody reaps does not hold it."""

from __future__ import annotations

import os
import subprocess
import time

from tapdeck.runner.process_group import group_alive, signal_group, wait_group_gone
from tests.support.processes import process_gone


def test_a_killed_group_with_a_background_child_is_waited_until_nothing_of_it_runs() -> None:
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 120 & echo $!; wait"], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert leader.stdout is not None
    child = int(leader.stdout.readline())
    assert group_alive(leader.pid)
    signal_group(leader.pid)
    leader.wait()
    assert wait_group_gone(leader.pid)
    assert not group_alive(leader.pid)
    assert process_gone(child)


def test_a_group_held_only_by_an_unreaped_zombie_is_gone() -> None:
    # We start it and do not reap it: its pid stays a zombie, which signal 0 still finds. Before
    # zombies were skipped, waiting on a sandbox whose `sleep` init never reaps took the full wait.
    exited = subprocess.Popen(["true"], start_new_session=True)
    try:
        while open(f"/proc/{exited.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            time.sleep(0.01)
        os.killpg(exited.pid, 0)  # the kernel still counts it in the group
        assert not group_alive(exited.pid)
        assert wait_group_gone(exited.pid, within_s=0.0)
    finally:
        exited.wait()
