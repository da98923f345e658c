"""Fixtures for the TUI tests: an App over a recorded API (deterministic), or over a real LocalServer."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_vllm import hanging_engine
from tests.support.hung_server import HungServer
from tests.support.local_server import local_server_on
from tests.support.recorded_api import API_FIXTURE, recorded_app


@pytest.fixture(autouse=True)
def utc_local_time() -> Iterator[None]:
    """Screens show clock times in local time (a training job's start): the tests read them in
    UTC, so that snapshots do not depend on the machine's zone."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if before is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = before
    time.tzset()


@pytest.fixture
def api_data() -> dict:
    return json.loads(API_FIXTURE.read_text())


@pytest.fixture
def make_app():
    """`make_app(mode, **kwargs)` → a TapdeckApp over the recorded API."""
    return recorded_app


@pytest.fixture
def hung_server(tmp_path: Path) -> Iterator[HungServer]:
    """A `HungServer` on its own data dir, stopped (with its engine) after the test."""
    with hanging_engine() as engine, local_server_on(engine, tmp_path / "data") as server:
        yield HungServer(engine, server, tmp_path / "tui.json")
