"""Signalling a process group: a child started in a session of its own (`start_new_session=True`)
leads a group that holds everything it started, so one signal reaches them all."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import TypeGuard

# Signals land asynchronously: a SIGKILLed process can still be running for a moment, longer on a
# loaded machine. Waiting this long for the group to go covers a busy CI box without hanging.
GONE_WITHIN_S = 10.0
GONE_POLL_S = 0.01


def signal_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to the group led by `pgid`; a group already gone (or no longer ours) is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of `/proc/<pid>/stat` after the command name (state first, then ppid, pgrp);
    None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):  # it ended while we looked
        return None


def _running(fields: list[bytes] | None) -> TypeGuard[list[bytes]]:
    return fields is not None and fields[0] not in (b"Z", b"X")


def process_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (an exited process its parent has not reaped)."""
    return _running(_stat(pid))


def group_alive(pgid: int) -> bool:
    """True while a process of the group led by `pgid` still runs. A zombie is not running: one
    whose parent never reaps it (a sandbox's `sleep` init) would otherwise keep the group alive."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _running(fields := _stat(entry.name)) and int(fields[2]) == pgid:
            return True
    return False


def wait_group_gone(pgid: int, within_s: float = GONE_WITHIN_S) -> bool:
    """Block until the group led by `pgid` has no process left, or `within_s` passed; True if gone."""
    deadline = time.monotonic() + within_s
    while group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(GONE_POLL_S)
    return True
