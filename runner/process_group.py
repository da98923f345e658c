"""Signalling a process group: a child started in a session of its own (`start_new_session=True`)
leads a group that holds everything it started, so one signal reaches them all."""

from __future__ import annotations

import contextlib
import os
import signal


def signal_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to the group led by `pgid`; a group already gone (or no longer ours) is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
