"""The Train screen at 80×24 against a real tapdeck server: launch the real data-check recipe as a
server job, see its log and metrics arrive over SSE, cycle the plot panels."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from textual.app import App
from textual.reactive import reactive
from textual.widgets import DataTable, Input, RichLog, Select, Static
from textual_plotext import PlotextPlot

from tapdeck.app.client import TapdeckClient
from tapdeck.app.screen_registry import SCREENS, key_of, screen_bindings
from tapdeck.app.screens.train import EVAL_LABEL, PANELS, TASKS, TrainScreen
from tapdeck.app.server_links import ServerLink, ServerLinks, host_port
from tapdeck.app.tui import TapdeckApp
from tapdeck.app.widgets.metric_plot import MetricPlot
from tests.support.pilot_wait import until
from tests.support.training_export import write_export

SHOT_DIR = os.environ.get("TAPDECK_SHOT_DIR")


class TrainOnlyApp(App[None]):
    """The App surface a tapdeck screen uses (client, status, the nav bar's screen list), with
    only the Train screen."""

    BINDINGS = screen_bindings()
    status: reactive[str] = reactive("")
    status_level: reactive[str] = reactive("info")
    # Screens forward their workers' failures here: the real app's reporting, on this app's status.
    report_worker_failure = TapdeckApp.report_worker_failure

    def __init__(self, client: TapdeckClient) -> None:
        super().__init__()
        self.client = client
        self.server_label = client.base_url
        self.links = ServerLinks([ServerLink(host_port(client.base_url), client.base_url, client)])
        self.train = TrainScreen()

    def on_mount(self) -> None:
        self.push_screen(self.train)

    def nav_entries(self) -> list[tuple[str, str, str]]:
        """The nav bar's tabs, from the screen registry as TapdeckApp gives them."""
        return [(key_of(self, e.binding_id), e.mode, e.title) for e in SCREENS]


@pytest.mark.medium
async def test_train_screen_launches_data_check_on_the_server_and_plots_its_metrics(
    train_server: Any, tmp_path: Path
) -> None:
    rows = write_export(tmp_path / "rows.jsonl")
    client = TapdeckClient(train_server.url, train_server.admin_key)
    app = TrainOnlyApp(client)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.train
        await until(
            pilot, lambda: screen.query_one("#train-recipe", Select).value == "data-check", "recipes loaded"
        )
        assert "does not update weights" in str(screen.query_one("#train-state", Static).render())
        screen.query_one("#train-args", Input).value = f"--rows {rows}"
        await pilot.click("#train-launch")
        await until(pilot, lambda: screen.job is not None and screen.job.state == "finished", "recipe ended")
        await until(
            pilot,
            lambda: "exit code 0" in str(screen.query_one("#train-state", Static).render()),
            "final state shown",
        )
        assert screen.points["train/reward"] == [(0, 0.5), (2, 0.5)]  # group 1 is unscorable: no reward
        assert screen.shown_metrics() == ["train/reward", "train/reward_std"]
        if SHOT_DIR:
            app.save_screenshot("train.svg", SHOT_DIR)
        assert "reward, last 0.5" in screen.query_one("#train-plot", PlotextPlot).plt.build()
        log_text = "\n".join(line.text for line in screen.query_one("#train-log", RichLog).lines)
        assert "step 1: group 1" in log_text and "data-check: summary" in log_text
        # Everything fits in 80×24: the plot and the log both got rows.
        assert screen.query_one("#train-plot", PlotextPlot).size.height >= 5
        assert screen.query_one("#train-log", RichLog).size.height >= 3
        screen.set_focus(None)
        await pilot.press("p")
        await until(pilot, lambda: screen.panel == "loss", "next panel")
        assert "loss: nothing logged yet" in screen.query_one("#train-plot", PlotextPlot).plt.build()
        await pilot.press("p")
        assert screen.panel == "kl/clip"
    await client.aclose()
    # The job ran on the server's machine, in its data dir.
    record = train_server.http.get(f"/admin/train/{screen.job.id}").json()
    assert record["run_dir"].startswith(str(tmp_path / "data")) and record["argv"][-2:] == [
        "--rows",
        str(rows),
    ]


@pytest.mark.medium
async def test_train_screen_shows_a_live_jobs_eval_and_reward_per_task(
    train_server: Any, eval_recipe: str
) -> None:
    # A real job of the server, its metrics read from its real trackio database as they arrive.
    client = TapdeckClient(train_server.url, train_server.admin_key)
    app = TrainOnlyApp(client)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.train
        await until(pilot, lambda: eval_recipe in screen.recipes, "recipes loaded")
        screen.query_one("#train-recipe", Select).value = eval_recipe
        await pilot.click("#train-launch")
        await until(pilot, lambda: screen.job is not None and screen.job.state == "finished", "recipe ended")
        await until(pilot, lambda: "eval/verifier_reward_delta" in screen.points, "the last step's metrics")
        plot = screen.query_one("#train-plot", MetricPlot)
        assert [(p.step, p.value) for p in plot.marks[EVAL_LABEL]] == [(0, 0.15), (3, 0.42)]
        assert "● eval 0.15 → 0.42" in plot.heading
        screen.set_focus(None)
        for _ in PANELS:
            await pilot.press("p")
        assert screen.panel == TASKS
        table = screen.query_one("#train-tasks", DataTable)
        assert [table.get_row_at(i)[:3] for i in range(table.row_count)] == [
            ["hello-file", "12", "0.50"],
            ["sum-numbers", "8", "0.25"],
        ]
    await client.aclose()


@pytest.mark.medium
async def test_train_screen_refusal_is_shown_not_raised(
    train_server: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("TAPDECK_TRAIN_ENV", str(tmp_path / "no-train-env"))
    client = TapdeckClient(train_server.url, train_server.admin_key)
    app = TrainOnlyApp(client)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.train
        await until(pilot, lambda: "cpu-grpo" in screen.recipes, "recipes loaded")
        screen.query_one("#train-recipe", Select).value = "cpu-grpo"
        await until(
            pilot,
            lambda: "train-env.sh" in str(screen.query_one("#train-state", Static).render()),
            "why it cannot start",
        )
        await pilot.click("#train-launch")
        await until(
            pilot,
            lambda: "did not start" in str(screen.query_one("#train-state", Static).render()),
            "the refusal",
        )
        assert screen.job is None
    await client.aclose()


@pytest.mark.medium
async def test_train_screen_is_reachable_in_the_tapdeck_app_with_key_6(
    train_server: Any, tmp_path: Path
) -> None:
    from tapdeck.app.tui import TapdeckApp

    client = TapdeckClient(train_server.url, train_server.admin_key)
    app = TapdeckApp(
        client, server_label=train_server.url, follow_events=False, settings_path=tmp_path / "tui.json"
    )
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("6")
        await until(pilot, lambda: app.current_mode == "train", "switched to Train")
        screen = app.screen
        assert isinstance(screen, TrainScreen)
        await until(pilot, lambda: "data-check" in screen.recipes, "recipes loaded")
        assert screen.job is None  # nothing launches until asked
    await client.aclose()
