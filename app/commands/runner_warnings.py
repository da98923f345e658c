"""The runner's warnings about a data dir's run files, said on a command's stderr as its own."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def runner_warnings_on_stderr(command: str) -> Iterator[None]:
    """The runner's warnings while the block reads run files (a run left out of the list, a
    result line skipped), each once on stderr as `tapdeck <command>: warning: …`. They are the
    server's log lines elsewhere; with no handler here Python printed them bare, beside the
    command's own lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter(f"tapdeck {command}: warning: %(message)s"))
    logger = logging.getLogger("tapdeck.runner")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
