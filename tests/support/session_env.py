"""The environment the tests run in, set once for the whole session by tests/conftest.py, and the
bare one a test gives a child process when it checks what runs without it."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

SESSION_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
"""litellm (imported with Harbor) would fetch its model cost map over the network at import; this
makes it read the copy it ships with. Child processes inherit it."""


def apply_session_env() -> None:
    """Give this process SESSION_ENV (a variable already set keeps its value)."""
    for name, value in SESSION_ENV.items():
        os.environ.setdefault(name, value)


def isolate_engine_registry() -> None:
    """Servers started by tests share embedded engines among themselves, never with one running
    on the machine outside the test run (runner/engine/registry.py)."""
    if "TAPDECK_ENGINE_REGISTRY" not in os.environ:
        os.environ["TAPDECK_ENGINE_REGISTRY"] = tempfile.mkdtemp(prefix="tapdeck-test-engines-")
        atexit.register(shutil.rmtree, os.environ["TAPDECK_ENGINE_REGISTRY"], True)


def shell_assignments() -> str:
    """SESSION_ENV as `NAME=value` words for `env` in a command a tmux session runs: the session
    gets the tmux server's environment, not this process's."""
    return " ".join(f"{name}={value}" for name, value in SESSION_ENV.items())


def base_env(**extra: str) -> dict[str, str]:
    """A bare environment for a child process: the system's PATH, SESSION_ENV and `extra`."""
    return {"PATH": "/usr/bin:/bin", **SESSION_ENV, **extra}
