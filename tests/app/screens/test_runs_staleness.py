"""Runs' `stale` column: per rollout, the policy versions its engine moved on since the rollout's
oldest turn was sampled (the engine's current version from `GET /admin/engines/version`, the
rollout's span from its session summary); "–" where either is unknown or not a step number."""

from __future__ import annotations

from textual.widgets import DataTable

from tapdeck.app.client import TapdeckClient
from tapdeck.app.tui import TapdeckApp
from tests.support.pilot_wait import until
from tests.support.recorded_api import FROZEN_NOW, recorded_transport

ENGINE = "http://127.0.0.1:8000"
"""The recorded sessions' engine, as versions are keyed (no `/v1`)."""


async def test_the_stale_column_is_the_engines_version_minus_the_rollouts_oldest(api_data):
    spans = {
        "sess0002recorded": {"oldest": 3, "newest": 4, "straddled": 1},  # hello-file #0
        "sess0004recorded": {"oldest": 5, "newest": 5, "straddled": 0},  # hello-file #1
        "sess0005recorded": {"oldest": "step-a", "newest": "step-a", "straddled": 0},  # greet #0
    }
    for session in api_data["sessions"]:
        session["policy"] = spans.get(session["id"])
    api_data["engine_versions"] = {
        "engines": [
            {"engine": None, "version": 1, "source": "trainer", "at": 0.0},
            {"engine": ENGINE, "version": 5, "source": "trainer", "at": 0.0},
        ]
    }
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    app = TapdeckApp(client, follow_events=False, clock=lambda: FROZEN_NOW, initial_mode="runs")
    async with app.run_test(size=(160, 48)) as pilot:
        table = app.screen.query_one("#rollouts-table", DataTable)
        await until(pilot, lambda: table.row_count == 4, "the run's rollouts")
        stale = {key.value: table.get_cell(key, "stale") for key in table.rows}
    assert stale == {
        "run-0001.g000r00": "2",  # sampled from version 3 on, the engine serves 5
        "run-0001.g000r01": "0",
        "run-0001.g001r00": "–",  # an engine's own label: no count
        "run-0001.g001r01": "–",  # no turn stamped
    }
