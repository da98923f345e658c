"""Drive a program in a real terminal (tmux), as a person would: the installed `tapdeck` console
script (tests.support.tapdeck_process.TAPDECK)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path


class Tmux:
    """One tmux session: send keys, read the screen, wait for text to appear."""

    def __init__(self, name: str) -> None:
        self.name = name

    def keys(self, *keys: str, pause: float = 0.3) -> None:
        for key in keys:
            subprocess.run(["tmux", "send-keys", "-t", self.name, key], check=True)
            time.sleep(pause)

    def screen(self) -> str:
        out = subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", self.name], check=True, capture_output=True, text=True
        ).stdout
        return "\n".join(line.rstrip() for line in out.splitlines())

    def wait_for(self, pattern: str, timeout: float = 120.0) -> str:
        """The screen once `pattern` shows on it; fails with the last screen after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if re.search(pattern, screen):
                return screen
            time.sleep(0.5)
        raise AssertionError(f"{pattern!r} never appeared; screen:\n{self.screen()}")


def exit_code(rc_file: Path, timeout: float = 60.0) -> str | None:
    """The exit code a shell wrote to `rc_file` (`echo $? > rc_file`) once its line is whole; None
    if none came within `timeout`. The file exists a moment before the line is in it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if rc_file.exists() and (text := rc_file.read_text()).endswith("\n"):
            return text.strip()
        time.sleep(0.5)
    return None
