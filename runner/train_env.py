"""The training environment: where recipes that need TRL, OpenEnv and torch run.

`scripts/train-env.sh` makes it (a Python 3.11 venv under `~/.cache/tapdeck/train-env`, every package
pinned in `scripts/train-env.txt`). tapdeck itself is not installed there: its dependencies need
Python 3.12. A recipe runs there as `python -m tapdeck.runner.recipes.<name>` with `PYTHONPATH`
naming a folder that holds one `tapdeck` link to this package's source, so it can import tapdeck's
3.11-clean modules — `tapdeck.runner.recipes.admin_client` (its only way to reach a tapdeck server),
`tapdeck.runner.recipes.data_check` and the pydantic-only `tapdeck.schema` (the plans it posts) —
and nothing else of tapdeck.
"""

from __future__ import annotations

import hashlib
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
    return Path(os.environ.get("TAPDECK_TRAIN_ENV") or Path.home() / ".cache" / "tapdeck" / "train-env")


def ensure_python(*, timeout_s: float = 1800.0) -> Path:
    """The training environment's python, making the environment first if needed (minutes, once)."""
    if not SCRIPT.is_file():
        raise TrainEnvUnavailable(f"{SCRIPT} is missing: the training environment is made from a tapdeck "
                                  "checkout (scripts/train-env.sh)")
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "TAPDECK_TRAIN_ENV": str(env_dir())})
    if proc.returncode != 0:
        tail = "\n".join(line for line in proc.stderr.splitlines()
                         if not line.startswith("WARNING: Location"))[-2000:]
        raise TrainEnvUnavailable(f"scripts/train-env.sh failed ({proc.returncode}):\n{tail}")
    return Path(proc.stdout.strip().splitlines()[-1])


def source_path() -> Path:
    """A folder whose only entry is a `tapdeck` link to this package's source (made once per checkout)."""
    key = hashlib.sha256(str(PACKAGE_ROOT).encode()).hexdigest()[:16]
    folder = env_dir().parent / "train-src" / key
    link = folder / "tapdeck"
    if not link.is_symlink() or link.resolve() != PACKAGE_ROOT:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".tapdeck-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(PACKAGE_ROOT, target_is_directory=True)
        os.replace(tmp, link)  # atomic: a concurrent reader sees the old link or the new one
    return folder


def recipe_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment variables for a recipe process in the training environment."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = str(source_path())
    return env
