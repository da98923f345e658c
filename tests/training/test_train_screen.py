"""The Train screen at 80×24: pick a run, launch the real data-check recipe, see its log and metrics.

The admin API answers with bodies shaped like the recorded ones (tests/app/fixtures/api.json) and an
export path to rows written by the real `tapdeck.proxy.export` functions; the recipe, trackio and
the reader are all real.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
from textual.app import App
from textual.reactive import reactive
from textual.widgets import Log, Select, Static
from textual_plotext import PlotextPlot
from training_data import write_export

from tapdeck.app.client import TapdeckClient
from tapdeck.app.screens.train import TrainScreen
from tests.app.pilot_wait import until

SHOT_DIR = os.environ.get("TAPDECK_SHOT_DIR")
RECORDED_RUNS = json.loads((Path(__file__).parents[1] / "app" / "fixtures" / "api.json").read_text())["runs"]


def api(export_path: Path) -> httpx.MockTransport:
    run = dict(RECORDED_RUNS[0], id="r-test", state="finished")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != "Bearer test-key":
            return httpx.Response(401, json={"detail": "admin key required"})
        if request.url.path == "/admin/sessions":
            return httpx.Response(200, json={"sessions": []})
        if request.url.path == "/admin/runs" and request.method == "GET":
            return httpx.Response(200, json={"runs": [run]})
        if request.url.path == "/admin/runs/r-test/export" and request.method == "POST":
            return httpx.Response(200, json={"path": str(export_path), "rows": 9, "skipped": {}})
        return httpx.Response(404, json={"detail": f"not found: {request.url.path}"})

    return httpx.MockTransport(handler)


class TrainOnlyApp(App[None]):
    """The App surface a tapdeck screen uses (client, status), with only the Train screen."""

    status: reactive[str] = reactive("")
    status_level: reactive[str] = reactive("info")

    def __init__(self, client: TapdeckClient, data_dir: Path) -> None:
        super().__init__()
        self.client = client
        self.server_label = "http://tapdeck.test"
        self.train = TrainScreen(data_dir=data_dir)

    def on_mount(self) -> None:
        self.push_screen(self.train)


async def test_train_screen_launches_data_check_and_plots_its_metrics(tmp_path: Path) -> None:
    export = write_export(tmp_path / "exports" / "r-test.jsonl")
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=api(export))
    app = TrainOnlyApp(client, tmp_path / "data")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.train
        await until(pilot, lambda: screen.query_one("#train-run", Select).value == "r-test", "runs loaded")
        assert "does not update weights" in str(screen.query_one("#train-state", Static).render())
        await pilot.press("l")
        await until(pilot, lambda: screen.job is not None and screen.job.state != "running", "recipe ended")
        await until(pilot, lambda: "exit code 0" in str(screen.query_one("#train-state", Static).render()),
                     "final state shown")
        assert screen.job.state == "finished"
        assert screen.points["train/reward"] == [(0, 0.5), (2, 0.5)]  # group 1 is unscorable: no reward
        assert screen.metric == "train/reward"
        assert screen.query_one("#train-metric", Select).value == "train/reward"
        if SHOT_DIR:
            app.save_screenshot("train.svg", SHOT_DIR)
        assert "train/reward (last 0.5)" in screen.query_one("#train-plot", PlotextPlot).plt.build()
        log_text = "\n".join(screen.query_one("#train-log", Log).lines)
        assert "step 1: group 1" in log_text and "data-check: summary" in log_text
        # Everything fits in 80×24: the plot and the log both got rows.
        assert screen.query_one("#train-plot", PlotextPlot).size.height >= 5
        assert screen.query_one("#train-log", Log).size.height >= 3
        record = json.loads((tmp_path / "data" / "train" / screen.job.run_id / "run.json").read_text())
        assert record["state"] == "finished" and record["argv"][-2:] == ["--rows", str(export)]


async def test_train_screen_is_reachable_in_the_tapdeck_app_with_key_6(tmp_path: Path) -> None:
    from tapdeck.app.tui import TapdeckApp

    export = write_export(tmp_path / "exports" / "r-test.jsonl")
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=api(export))
    app = TapdeckApp(client, server_label="http://tapdeck.test", follow_events=False,
                     settings_path=tmp_path / "tui.json")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("6")
        await until(pilot, lambda: app.current_mode == "train", "switched to Train")
        screen = app.screen
        assert isinstance(screen, TrainScreen)
        await until(pilot, lambda: screen.query_one("#train-run", Select).value == "r-test", "runs loaded")
        assert screen.job is None  # nothing launches until asked
