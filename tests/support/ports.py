"""Loopback ports for servers a test starts."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port() -> int:
    """A loopback port nobody holds right now, for a process to bind a moment later.

    Picked below the kernel's ephemeral range where it can: a port the kernel hands out (bind to
    port 0, or the local end of any outgoing connection, this run's or another's) could be taken
    in between, and the server started on it would find it in use."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    for _ in range(100 if low > 11_000 else 0):
        port = random.SystemRandom().randrange(10_000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
