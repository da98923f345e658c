"""The Train screen says whether a run learned: the held-out eval's verifier reward before and after
training as points with their 95% intervals on the reward plot, apart from the training curve and
named in its legend, and a tasks panel (the last of `p`'s) with, per task, the training rollouts,
their mean verifier reward and the eval before → after. A run that logged none of it shows what it
did before.

Over the recorded API plus a cpu-grpo job whose metrics are what the server's trackio reader reads
from a real trackio database (logged by the trackio package: tests/support/trackio_runs.py);
snapshots at 80×24."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable, Static

from tapdeck.app.screens.train import EVAL_LABEL, TASKS
from tapdeck.app.widgets.metric_plot import IntervalPoint, MetricPlot
from tapdeck.runner.train_jobs import read_metrics
from tapdeck.runner.training import RunRecord
from tests.support.pilot_wait import until
from tests.support.recorded_api import recorded_app
from tests.support.trackio_runs import eval_run_logs, write_trackio

JOB = "train-0001"
CPU_LOG = ["cpu-grpo: eval before training", "cpu-grpo: step 3/3", "cpu-grpo: eval after training"]


def _logged(root: Path, with_eval: bool) -> list[dict[str, Any]]:
    """The metrics `GET /admin/train/{id}/metrics` gives for a job whose recipe logged
    `eval_run_logs(with_eval=...)` to trackio."""
    run_dir = root / JOB
    write_trackio(run_dir / "trackio", "tapdeck", JOB, eval_run_logs(with_eval=with_eval))
    record = RunRecord(
        run_id=JOB,
        recipe="cpu-grpo",
        argv=[],
        env={},
        cwd=str(root),
        run_dir=str(run_dir),
        trackio_dir=str(run_dir / "trackio"),
        trackio_project="tapdeck",
    )
    return [p.model_dump() for p in read_metrics(record, 0).points]


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, list[dict[str, Any]]]:
    """The job's metrics with its eval (True) and without (False), each read from its own database."""
    return {
        with_eval: _logged(tmp_path_factory.mktemp(f"eval-{with_eval}"), with_eval)
        for with_eval in (True, False)
    }


def _with_job(api_data: dict, points: list[dict[str, Any]]) -> dict:
    """`api_data` whose server also ran a finished cpu-grpo job, newer than the recorded data-check."""
    recorded = api_data["train"]
    job = {
        **copy.deepcopy(recorded["runs"]["runs"][0]),
        "id": JOB,
        "recipe": "cpu-grpo",
        "argv": ["/train-env/bin/python", "-u", "-m", "tapdeck.runner.recipes.cpu_grpo", "--steps", "3"],
        "run_dir": f"/data/train/{JOB}",
        "state": "finished",
        "exit_code": 0,
        "started_at": 1700003600.0,
        "finished_at": 1700004200.0,
        "pid": 13500,
    }
    recorded["runs"]["runs"].insert(0, job)
    recorded["logs"][JOB] = {"lines": CPU_LOG, "offset": 96}
    recorded["metrics"][JOB] = {"points": points, "cursor": len(points)}
    recorded["events"][JOB] = [{"type": "state", "run": job}, {"type": "log", "lines": CPU_LOG}]
    return api_data


def _shown(app: Any) -> bool:
    """The cpu-grpo job's metrics are on the screen."""
    state = str(app.screen.query_one("#train-state", Static).render())
    return app.current_mode == "train" and f"{JOB} · cpu-grpo · finished" in state and app.screen.points


async def _to_tasks(pilot: Any) -> None:
    """Press `p` until the tasks panel shows (the focus on no field: `p` would be text there)."""
    screen = pilot.app.screen
    screen.set_focus(None)
    for _ in range(8):  # bounded: a panel order that never reaches it fails below
        if screen.panel == TASKS:
            break
        await pilot.press("p")
    assert screen.panel == TASKS


def _screen_lines(app: Any) -> list[str]:
    return ["".join(segment.text for segment in strip) for strip in app.screen._compositor.render_strips()]


def _tasks(app: Any) -> list[list[str]]:
    table = app.screen.query_one("#train-tasks", DataTable)
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


@pytest.mark.medium
@pytest.mark.parametrize("size", [(80, 24), (100, 40)])
async def test_the_reward_plot_marks_the_eval_before_and_after_with_its_intervals(
    api_data, logged, size
) -> None:
    app = recorded_app("train", _with_job(api_data, logged[True]))
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: _shown(app), "the cpu-grpo job's metrics")
        plot = app.screen.query_one("#train-plot", MetricPlot)
        assert plot.marks == {
            EVAL_LABEL: [IntervalPoint(0, 0.15, 0.07, 0.29), IntervalPoint(3, 0.42, 0.28, 0.57)]
        }
        assert list(plot.series) == ["reward", "reward_std"]  # the training curve, drawn apart
        # The title names the marks whatever room the legend has.
        assert plot.heading == "reward, last 0.7 · ● eval 0.15 → 0.42 (│ 95% CI)"
        await until(pilot, lambda: any("step" == line.strip() for line in _screen_lines(app)), "the plot")
        drawn = "\n".join(_screen_lines(app))
        legend = f"●● {EVAL_LABEL}" in drawn
        # The title's marker and the two points (drawn over their intervals), and the legend's two
        # where it has room: not on the two rows 80×24 leaves the canvas beside two jobs.
        assert drawn.count("●") == 3 + 2 * legend and legend == (size != (80, 24)), drawn


@pytest.mark.medium
async def test_the_tasks_panel_gives_each_tasks_training_reward_and_eval(api_data, logged) -> None:
    app = recorded_app("train", _with_job(api_data, logged[True]))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: _shown(app), "the cpu-grpo job's metrics")
        await _to_tasks(pilot)
        # hello-file: 4 rollouts at each of 3 steps (0.25, 0.5, 0.75); sum-numbers: 4 at steps 2, 3.
        assert _tasks(app) == [
            ["hello-file", "12", "0.50", "0.25 (n 20)", "0.60 (n 20)"],
            ["sum-numbers", "8", "0.25", "0.05 (n 20)", "0.25 (n 20)"],
        ]
        note = str(app.screen.query_one("#train-tasks-note", Static).render())
        assert note == "verifier reward per task: training mean over 3 step(s); eval before → after"
        assert (
            app.screen.query_one("#train-tasks").display and not app.screen.query_one("#train-plot").display
        )
        await pilot.press("p")  # the cycle goes round to the reward plot again
        assert app.screen.panel == "reward" and app.screen.query_one("#train-plot").display


@pytest.mark.medium
async def test_a_run_that_logged_no_eval_has_no_eval_points_and_says_so_per_task(api_data, logged) -> None:
    app = recorded_app("train", _with_job(api_data, logged[False]))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: _shown(app), "the cpu-grpo job's metrics")
        plot = app.screen.query_one("#train-plot", MetricPlot)
        assert plot.marks == {} and plot.heading == "reward, last 0.7"
        await _to_tasks(pilot)
        assert _tasks(app) == [["hello-file", "12", "0.50", "–", "–"], ["sum-numbers", "8", "0.25", "–", "–"]]


@pytest.mark.medium
async def test_a_run_that_logged_no_task_reward_says_its_tasks_panel_is_empty(api_data) -> None:
    app = recorded_app("train", api_data)  # the recorded data-check: neither eval nor tasks
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: bool(app.screen.points), "the data-check's metrics")
        assert app.screen.query_one("#train-plot", MetricPlot).marks == {}
        await _to_tasks(pilot)
        assert _tasks(app) == []
        note = str(app.screen.query_one("#train-tasks-note", Static).render())
        assert note == "reward per task: not logged by this run (cpu-grpo logs it with its held-out eval)"


def _snapshot_of(tasks: bool):
    """What a snapshot waits for: the job's metrics shown, on the tasks panel when `tasks`."""

    async def ready(pilot: Any) -> None:
        await until(pilot, lambda: _shown(pilot.app), "the cpu-grpo job's metrics")
        if tasks:
            await _to_tasks(pilot)
        await pilot.pause(0.3)  # a refresh tick after the data, and any layout it causes
        await pilot.wait_for_scheduled_animations()

    return ready


@pytest.mark.medium
def test_snapshot_of_the_reward_plot_with_the_eval(snap_compare, api_data, logged) -> None:
    app = recorded_app("train", _with_job(api_data, logged[True]))
    assert snap_compare(app, terminal_size=(80, 24), run_before=_snapshot_of(False))


@pytest.mark.medium
def test_snapshot_of_the_tasks_panel(snap_compare, api_data, logged) -> None:
    app = recorded_app("train", _with_job(api_data, logged[True]))
    assert snap_compare(app, terminal_size=(80, 24), run_before=_snapshot_of(True))
