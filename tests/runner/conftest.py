"""Runner test fixtures: a real tapdeck server (proxy + store + runner routes) in this process.

Runs execute on the server's runner loop (an asyncio loop on a thread of its own), so tests drive
them only through the HTTP admin API, exactly as the CLI and the TUI do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.runner_server import RunnerServer, runner_server_on


@pytest.fixture(scope="session")
def runner_server(embedded_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerServer]:
    """A tapdeck server whose default engine is the shared embedded engine."""
    with runner_server_on(embedded_engine, tmp_path_factory.mktemp("tapdeck-data")) as server:
        yield server
