"""How a `tapdeck` command ends: the exit codes every command shares (README's list), and the
error a command raises to end with one of them and the line that says why.

A command that ends on one line raises CommandError rather than printing the line and exiting:
the CLI's root command group (app/cli.py) prints it, the one place that does.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_COULD_NOT_RUN = 1
"""The command could not do its work: a server or engine that does not answer, a missing or
corrupt store, run or session, a path it cannot use, a recipe that failed."""
EXIT_USAGE = 2
"""Bad usage: also what the command line parser exits with for an unknown option or a bad value."""
EXIT_ROLLOUT_FAILED = 3
"""`tapdeck rollout`: the run ended with some rollout not ok (failed or cancelled)."""
EXIT_TIMED_OUT = 124
"""`tapdeck exec`: the command ran past --timeout and was killed (the code timeout(1) exits with)."""


class CommandError(Exception):
    """End the command with exit `code`, `line` printed on stderr (the line names the command,
    e.g. `tapdeck runs: ...`)."""

    def __init__(self, code: int, line: str) -> None:
        super().__init__(line)
        self.code = code
        self.line = line
