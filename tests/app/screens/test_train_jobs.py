"""Train lists the server's training jobs (newest first, with recipe, state and start) and shows the
highlighted one's log and plots: an operator who ran a data-check and then a cpu-grpo job can look
at the data-check again. Over the recorded API plus a second, newer job."""

from __future__ import annotations

import copy

import pytest
from textual.widgets import DataTable, RichLog, Static

from tapdeck.app.client import TapdeckClient
from tapdeck.app.screens import train
from tapdeck.app.tui import TapdeckApp
from tapdeck.schema.train import TrainRunInfo
from tests.support.pilot_wait import until
from tests.support.recorded_api import FROZEN_NOW, recorded_transport

CPU_LOG = ["cpu-grpo: step 1/2, loss 0.125", "cpu-grpo: step 2/2, loss 0.0625"]


def _with_cpu_grpo(api_data: dict, state: str) -> dict:
    """`api_data` whose server also ran a cpu-grpo job after the recorded data-check."""
    recorded = api_data["train"]
    job = {
        **copy.deepcopy(recorded["runs"]["runs"][0]),
        "id": "train-0001",
        "recipe": "cpu-grpo",
        "state": state,
        "started_at": 1700003600.0,
        "pid": 13500,
        "exit_code": 0 if state == "finished" else None,
        "finished_at": 1700003700.0 if state == "finished" else None,
    }
    recorded["runs"]["runs"].insert(0, job)
    recorded["logs"]["train-0001"] = {"lines": CPU_LOG, "offset": 64}
    recorded["metrics"]["train-0001"] = {"points": [], "cursor": 0}
    recorded["events"]["train-0001"] = [{"type": "state", "run": job}, {"type": "log", "lines": CPU_LOG}]
    return api_data


def _app(api_data: dict) -> TapdeckApp:
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    return TapdeckApp(client, follow_events=False, clock=lambda: FROZEN_NOW, initial_mode="train")


def _log(app: TapdeckApp) -> str:
    return "\n".join(line.text for line in app.screen.query_one("#train-log", RichLog).lines)


@pytest.mark.medium
async def test_train_lists_the_jobs_and_shows_the_highlighted_ones_log(api_data):
    app = _app(_with_cpu_grpo(api_data, "finished"))
    async with app.run_test(size=(80, 24)) as pilot:
        jobs = app.screen.query_one("#train-jobs", DataTable)
        await until(
            pilot,
            lambda: jobs.row_count == 2 and "loss 0.0625" in _log(app),
            "the jobs, the newest one's log",
        )
        assert [jobs.get_row_at(i) for i in range(2)] == [
            ["train-0001", "cpu-grpo", "finished", "11-14 23:13"],
            ["train-0000", "data-check", "finished", "11-14 22:14"],
        ]
        # The older job, picked as a person does at 80×24: to the table, one row down.
        for _ in range(8):  # bounded: a changed focus order fails below instead of looping
            if app.focused is jobs:
                break
            await pilot.press("tab")
        assert app.focused is jobs
        await pilot.press("down")
        state = app.screen.query_one("#train-state", Static)
        await until(
            pilot,
            lambda: (
                "data-check: summary rollouts=4" in _log(app)
                and "finished (exit code 0)" in str(state.render())
            ),
            "the data-check's log",
        )
        assert "cpu-grpo" not in _log(app)
        assert str(state.render()).startswith("train-0000 · data-check · finished")
        assert app.screen.points  # its metrics, plotted
        await pilot.press("up")
        await until(pilot, lambda: "loss 0.0625" in _log(app), "the cpu-grpo log again")
        assert "data-check: summary" not in _log(app)


async def test_a_running_job_not_shown_reads_ended_once_it_ends(api_data, monkeypatch):
    monkeypatch.setattr(train, "JOBS_POLL_S", 0.1)
    data = _with_cpu_grpo(api_data, "running")
    app = _app(data)
    async with app.run_test(size=(80, 24)) as pilot:
        jobs = app.screen.query_one("#train-jobs", DataTable)
        await until(pilot, lambda: jobs.row_count == 2 and "loss 0.0625" in _log(app), "the live job")
        app.screen.open_job(app.screen.jobs[1])  # the data-check is looked at meanwhile
        # Another launch is refused while a job runs, though the shown one has ended.
        await until(pilot, lambda: "data-check: summary" in _log(app), "the data-check's log")
        app.screen.action_launch()
        await until(
            pilot,
            lambda: any("train-0001 (cpu-grpo) is already running" in n.message for n in app._notifications),
            "the launch refused",
        )
        data["train"]["runs"]["runs"][0].update(state="finished", exit_code=0)
        await until(pilot, lambda: jobs.get_row("train-0001")[2] == "finished", "the ended job's row")


@pytest.mark.medium
async def test_train_without_jobs_says_how_to_launch_one(api_data):
    recorded = api_data["train"]
    job = recorded["runs"]["runs"].pop()
    app = _app(api_data)
    async with app.run_test(size=(80, 24)) as pilot:
        hint = "no training jobs yet: pick a recipe above and press l (Launch) to start one"

        def shown() -> str:
            return "\n".join(
                "".join(s.text for s in strip) for strip in app.screen._compositor.render_strips()
            )

        await until(pilot, lambda: hint in shown(), "the hint")
        assert "started" not in shown()  # no bare header of an empty table
        # A job launched (here: listed) replaces the hint with the table, its row shown.
        app.screen._show_jobs([TrainRunInfo(**job)])
        await until(pilot, lambda: "train-0000  data-check  finished" in shown(), "the job's row")
        assert hint not in shown()
