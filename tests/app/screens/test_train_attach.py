"""Training under `tapdeck attach`: the TUI (the app `attach` runs, driven by Pilot) talks to a
`tapdeck serve` in another process, launches a recipe there, watches a metric arrive and stops it.

The recipe is data-check with a pause between steps (`--step-delay`), so it is still running when
its first metric arrives; cpu-grpo takes minutes before its first metric on 2 cores and has its own
end-to-end test (test_cpu_grpo.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from textual.widgets import Input, Select
from textual_plotext import PlotextPlot

from tapdeck.app.client import TapdeckClient
from tapdeck.app.screens.train import TrainScreen
from tests.support.fake_vllm import models_only_engine
from tests.support.pilot_wait import until
from tests.support.processes import process_gone
from tests.support.tapdeck_process import TAPDECK, tapdeck_serve
from tests.support.training_export import write_export

ADMIN_KEY = "train-attach-admin-key"

pytestmark = pytest.mark.skipif(not TAPDECK.exists(), reason="needs the installed tapdeck console script")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """`tapdeck serve` as its own process on a free port (its engine is never needed here)."""
    with (
        models_only_engine() as engine,
        tapdeck_serve(
            TAPDECK, tmp_path / "server-data", tmp_path / "serve.log", admin_key=ADMIN_KEY, engine_url=engine
        ) as process,
    ):
        yield process.url


@pytest.mark.medium
async def test_attached_tui_launches_a_recipe_on_the_server_sees_a_metric_and_stops_it(
    served: str, tmp_path: Path
) -> None:
    from tapdeck.app.tui import TapdeckApp

    rows = write_export(tmp_path / "rows.jsonl")
    client = TapdeckClient(served, ADMIN_KEY)
    app = TapdeckApp(client, server_label=served, follow_events=False, settings_path=tmp_path / "tui.json")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("6")
        await until(pilot, lambda: isinstance(app.screen, TrainScreen), "the Train screen")
        screen = app.screen
        await until(pilot, lambda: "data-check" in screen.recipes, "recipes from the server", timeout=60)
        screen.query_one("#train-recipe", Select).value = "data-check"
        screen.query_one("#train-args", Input).value = f"--rows {rows} --step-delay 30"
        await pilot.click("#train-launch")
        await until(pilot, lambda: screen.points.get("train/reward"), "a metric from the server", timeout=90)
        assert screen.running and screen.job.recipe == "data-check"
        assert "reward, last 0.5" in screen.query_one("#train-plot", PlotextPlot).plt.build()
        await pilot.click("#train-stop")
        await until(pilot, lambda: screen.job.state == "stopped", "stopped", timeout=60)
        assert "stopped" in str(screen.query_one("#train-state").render())
        run_id, pid = screen.job.id, screen.job.pid
    await client.aclose()

    # The server saw it: its own record says stopped, and the recipe's process is gone.
    doc = httpx.get(f"{served}/admin/train/{run_id}", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
    assert doc["state"] == "stopped" and doc["pid"] == pid
    assert process_gone(pid)
