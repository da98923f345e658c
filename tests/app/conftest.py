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


@pytest.fixture
def eval_recipe(monkeypatch: pytest.MonkeyPatch) -> str:
    """A recipe on the test server (it runs in this process) that logs, with real trackio, what
    cpu-grpo logs around its held-out eval (tests/support/eval_recipe.py); its name."""
    from tapdeck.runner.recipes import RECIPES, Recipe

    root = str(Path(__file__).resolve().parents[2])  # where `tests.support` imports from
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]))
    recipe = Recipe(
        name="eval-logs",
        module="tests.support.eval_recipe",
        summary="test: logs an eval'd run",
        where="here",
        updates_weights=False,
        needs=("trackio",),
    )
    monkeypatch.setitem(RECIPES, recipe.name, recipe)
    return recipe.name
