"""Runs' header names the engine a run's rollouts really called (the server records it), not the
plan's word "embedded", which means the server's default engine and that may be an engine URL."""

from __future__ import annotations

from textual.widgets import Static

from tapdeck.app.client import TapdeckClient
from tapdeck.app.tui import TapdeckApp
from tests.support.pilot_wait import until
from tests.support.recorded_api import FROZEN_NOW, recorded_transport


def _header_for(api_data: dict, engine_used: str | None, width: int = 80):
    """Run the App on Runs over `api_data` whose newest run called `engine_used`."""
    for body in (
        api_data["run_details"]["run-0001"],
        next(r for r in api_data["runs"] if r["id"] == "run-0001"),
    ):
        assert body["plan"]["rollout"]["engine"] == "embedded"  # as `rollout --engine URL` writes it
        body["engine_used"] = engine_used
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    return TapdeckApp(client, follow_events=False, clock=lambda: FROZEN_NOW, initial_mode="runs")


async def _header(app: TapdeckApp, size: tuple[int, int]) -> str:
    async with app.run_test(size=size) as pilot:
        header = app.screen.query_one("#run-header", Static)
        await until(pilot, lambda: "run-0001" in str(header.render()), "the run's header")
        return str(header.render())


async def test_run_header_shows_the_url_engine_a_run_of_the_default_engine_called(api_data):
    url = "http://gpu-box.cluster.internal.example.org:8000/v1"
    header = await _header(_header_for(api_data, url), (80, 24))
    assert "embedded" not in header
    # Cut to one line at 80 columns: its scheme and /v1 dropped, the host cut before its port.
    assert (
        len(header) == 78
        and header == "run run-0001 · sample · terminus-2 · host · gpu-box.cluster.intern…:8000 · K=2"
    )
    wide = await _header(_header_for(api_data, url), (160, 48))
    assert " · gpu-box.cluster.internal.example.org:8000 · K=2" in wide


async def test_run_header_says_embedded_and_no_engine_as_the_server_recorded(api_data):
    assert " · embedded · K=2" in await _header(_header_for(api_data, "embedded"), (80, 24))
    assert " · no engine · K=2" in await _header(_header_for(api_data, "none"), (80, 24))
