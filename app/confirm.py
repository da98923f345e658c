"""The two-press confirmation that destructive keys share (`q` with runs going, `x` on Runs and
Sessions): the first press arms it for one target, a second press on the same target within
CONFIRM_S goes ahead; anything else starts over."""

from __future__ import annotations

from dataclasses import dataclass

CONFIRM_S = 5.0
"""How long a first press stays armed."""


@dataclass
class TwoPress:
    """`press(target, now)` is True on the confirming press, False on the arming one."""

    armed: str | None = None
    armed_at: float = 0.0

    def press(self, target: str, now: float) -> bool:
        """Arm for `target`, or confirm it when it was armed for it less than CONFIRM_S ago."""
        if self.armed == target and now - self.armed_at <= CONFIRM_S:
            self.disarm()
            return True
        self.armed, self.armed_at = target, now
        return False

    def disarm(self) -> None:
        """Forget the armed press (the target changed under it)."""
        self.armed = None
