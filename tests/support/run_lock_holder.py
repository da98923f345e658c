"""Another process holding a run's lock, as a process running that run does."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

HOLD = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from tapdeck.runner.run_lock import RunLock\n"
    "assert RunLock(Path(sys.argv[1])).claim() is None\n"
    "print('held', flush=True)\n"
    "time.sleep(600)\n"
)


@contextlib.contextmanager
def holding_run_lock(run_dir: Path) -> Iterator[subprocess.Popen]:
    """A process that holds `run_dir`'s run lock until the block ends (then it is killed)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
