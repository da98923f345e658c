"""The training environment: where recipes that need TRL, OpenEnv and torch run.

`scripts/train-env.sh` makes it (a Python 3.11 venv under `~/.cache/tapdeck/train-env`, every package
pinned in `scripts/train-env.txt`). tapdeck itself is not installed there: its dependencies need
Python 3.12. A recipe runs there as `python -m tapdeck.runner.recipes.<name>` with `PYTHONPATH`
naming a folder that holds one `tapdeck` link to this package's source (`training.package_path`),
so it can import tapdeck's
3.11-clean modules — `tapdeck.runner.recipes.admin_client` (its only way to reach a tapdeck server),
`tapdeck.runner.recipes.data_check` and the pydantic-only `tapdeck.schema` (the plans it posts) —
and nothing else of tapdeck.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import tapdeck

PACKAGE_ROOT = Path(tapdeck.__file__).resolve().parent
SCRIPT = PACKAGE_ROOT / "scripts" / "train-env.sh"


class TrainEnvUnavailable(RuntimeError):
    """The training environment cannot be made here (no Python 3.11, no script, install failed)."""


def env_dir() -> Path:
    """`$TAPDECK_TRAIN_ENV`, else `~/.cache/tapdeck/train-env`."""
    env = os.environ.get("TAPDECK_TRAIN_ENV")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tapdeck" / "train-env"


def ensure_python(*, timeout_s: float = 1800.0) -> Path:
    """The training environment's python, making the environment first if needed (minutes, once)."""
    if not SCRIPT.is_file():
        raise TrainEnvUnavailable(
            f"{SCRIPT} is missing: the training environment is made from a tapdeck "
            "checkout (scripts/train-env.sh)"
        )
    proc = subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "TAPDECK_TRAIN_ENV": str(env_dir())},
    )
    if proc.returncode != 0:
        tail = "\n".join(
            line for line in proc.stderr.splitlines() if not line.startswith("WARNING: Location")
        )[-2000:]
        raise TrainEnvUnavailable(f"scripts/train-env.sh failed ({proc.returncode}):\n{tail}")
    return Path(proc.stdout.strip().splitlines()[-1])
