"""Signalling a process group: a child started in a session of its own (`start_new_session=True`)
leads a group that holds everything it started, so one signal reaches them all."""

from __future__ import annotations

import contextlib
import os
import signal
import time

# Signals land asynchronously: a SIGKILLed process can still be running for a moment, longer on a
# loaded machine. Waiting this long for the group to go covers a busy CI box without hanging.
GONE_WITHIN_S = 10.0
GONE_POLL_S = 0.01


def signal_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to the group led by `pgid`; a group already gone (or no longer ours) is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """True while a process of the group led by `pgid` still runs. A zombie is not running: one
    whose parent never reaps it (a sandbox's `sleep` init) would otherwise keep the group alive."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
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
