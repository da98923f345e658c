"""Fixtures for the runner's tests: a real tapdeck server (proxy + store + runner routes) on the
embedded engine in this process, and the training environment's python. For the agent binaries, a
scripted engine with a capture server in front (`scripted`, `upstream`, `capture`, from
tests/support/capture_server.py): here `upstream` is that shared engine, reset after each test, not
the fresh one per test of tests/conftest.py.

Runs execute on the server's runner loop (an asyncio loop on a thread of its own), so tests drive
them only through the HTTP admin API, exactly as the CLI and the TUI do.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.capture_server import capture, scripted, upstream  # noqa: F401  (fixtures)
from tests.support.runner_server import RunnerServer, runner_server_on


@pytest.fixture(scope="session")
def runner_server(embedded_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerServer]:
    """A tapdeck server whose default engine is the shared embedded engine."""
    with runner_server_on(embedded_engine, tmp_path_factory.mktemp("tapdeck-data")) as server:
        yield server


@pytest.fixture(scope="session")
def train_python() -> Path:
    """The training environment's python (Python 3.11, CPU torch, trl 1.16.0, openenv 0.10.0).

    Made by scripts/train-env.sh on first use (minutes, once per machine; cached under
    ~/.cache/tapdeck/train-env), so a fresh CI machine builds it here.
    """
    from tapdeck.runner.train_env import ensure_python

    return ensure_python()
