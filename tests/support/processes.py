"""Processes of this machine as a test sees them: whether one is gone, and what the host-sandbox
trials of a process still have running."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def process_gone(pid: int) -> bool:
    """True when `pid` no longer runs (a zombie nobody reaped yet counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


class SandboxProcesses:
    """Every process of the host-sandbox trials that process `pid` has running now, found by mount
    namespace (so a daemon that left the process tree, such as a tmux server, still counts).

    Each namespace is held open while this lives: a dead namespace's id is reused at once, and
    without the pin a later trial could be mistaken for a survivor.
    """

    def __init__(self, pid: int) -> None:
        own = os.readlink(f"/proc/{pid}/ns/mnt")
        self.pins: dict[str, int] = {}
        for child in _descendants(pid):
            with contextlib.suppress(OSError):
                fd = os.open(f"/proc/{child}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
                namespace = os.readlink(f"/proc/self/fd/{fd}")
                if namespace == own or namespace in self.pins:
                    os.close(fd)
                else:
                    self.pins[namespace] = fd

    def commands(self) -> list[str]:
        """The command name of every process in the pinned namespaces."""
        from tapdeck.runner.sandboxes.namespaces import processes_in_namespace

        names = []
        for namespace in self.pins:
            for pid in processes_in_namespace(namespace):
                with contextlib.suppress(OSError):
                    names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        return names

    def survivors(self, attempts: int = 300) -> list[str]:
        """Commands still running in the pinned namespaces once they empty or `attempts` checks
        (0.1 s apart) pass: killed processes take a moment to be reaped."""
        import time

        for _ in range(attempts):
            left = self.commands()
            if not left:
                return []
            time.sleep(0.1)
        return left

    def close(self) -> None:
        """Kill whatever is left (a failing test leaves nothing running) and drop the pins."""
        from tapdeck.runner.sandboxes.namespaces import processes_in_namespace

        for namespace, fd in self.pins.items():
            for pid in processes_in_namespace(namespace):
                with contextlib.suppress(OSError):
                    os.kill(pid, 9)
            os.close(fd)
        self.pins = {}


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` in the process tree (from /proc's PPid fields)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{entry}/status").read_text().splitlines():
                    if line.startswith("PPid:"):
                        parents[int(entry)] = int(line.split()[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        frontier += children
    return found
