"""Train: pick a recipe and a rollout run, launch, follow the log and the trackio metrics.

The recipe runs as a subprocess of this TUI process (`tapdeck.runner.training.TrainingRun`), so its
data lives in this machine's data dir; the run's training rows come from the server's
`POST /admin/runs/{id}/export` (which must be a path this machine can read: embedded mode, or a
server on the same host). Metrics are read from the run's trackio SQLite by a thread worker at
~1 Hz (trackio itself is never imported here).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from textual import on, work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import Button, Log, Select, Static
from textual.worker import get_current_worker
from textual_plotext import PlotextPlot

from tapdeck.app.screens.base import TapdeckScreen

POLL_S = 1.0
PREFERRED_METRICS = ("train/reward", "train/loss", "train/batch/trained_tokens_per_step")


class TrainScreen(TapdeckScreen):
    """Launch a training recipe on a run's exported rows; live log and metric plot."""

    MODE = "train"
    HELP = ("Train: choose a recipe and a rollout run, press l (or Launch) to start; s stops it "
            "(SIGTERM, then SIGKILL of its process group). The log is the recipe's output; the plot "
            "shows one trackio metric (pick it in the metric list). data-check only checks and scores "
            "rows (no weights change); grpo-trl needs a GPU box with vLLM.")

    BINDINGS = [
        Binding("l", "launch", "Launch", id="train.launch"),
        Binding("s", "stop", "Stop", id="train.stop"),
        Binding("r", "reload", "Reload runs", id="train.reload"),
    ]

    DEFAULT_CSS = """
    #train-controls { height: 1; }
    #train-controls Select { width: 1fr; }
    #train-recipe { max-width: 24; }
    #train-controls Button { min-width: 8; width: auto; margin-left: 1; }
    #train-state { height: 1; padding: 0 1; color: $text-muted; }
    #train-body { height: 1fr; }
    #train-metric { height: 1; }
    #train-plot { height: 1fr; min-height: 5; }
    #train-log { height: 1fr; min-height: 4; border-top: hkey $panel; }
    """

    def __init__(self, data_dir: Path | None = None) -> None:
        super().__init__()
        self._data_dir = data_dir
        self.job: Any = None
        self.points: dict[str, list[tuple[int, float]]] = {}
        self.metric: str | None = None

    @property
    def data_dir(self) -> Path:
        """Where training runs go: this screen's, the App's, or the default data dir."""
        if self._data_dir is None:
            from tapdeck.proxy.config import default_data_dir

            self._data_dir = getattr(self.app, "data_dir", None) or default_data_dir()
        return Path(self._data_dir)

    def compose_body(self) -> Iterable[Widget]:
        from tapdeck.runner.recipes import DEFAULT_RECIPE, RECIPES

        with Horizontal(id="train-controls"):
            yield Select([(name, name) for name in RECIPES], value=DEFAULT_RECIPE, allow_blank=False,
                         id="train-recipe", compact=True)
            yield Select([], prompt="rollout run…", id="train-run", compact=True)
            yield Button("Launch", id="train-launch", variant="primary", compact=True)
            yield Button("Stop", id="train-stop", variant="error", disabled=True, compact=True)
        yield Static("", id="train-state")
        with Vertical(id="train-body"):
            yield Select([], prompt="metric…", id="train-metric", compact=True)
            yield PlotextPlot(id="train-plot")
            yield Log(id="train-log", max_lines=2000)

    def on_mount(self) -> None:
        self._describe_recipe()
        self.action_reload()

    def on_unmount(self) -> None:
        # A recipe must not outlive the UI that owns its output pipe.
        if self.job is not None and self.job.state == "running":
            self.job.stop(grace_s=2.0)

    # -- choices ------------------------------------------------------------------------------------
    def action_reload(self) -> None:
        self.load_runs()

    @work(group="train-runs", exclusive=True, exit_on_error=False)
    async def load_runs(self) -> None:
        """Fill the run picker from `GET /admin/runs` (newest first)."""
        runs = await self.client.runs()
        runs = sorted(runs, key=lambda r: r.get("created_at") or 0, reverse=True)
        select = self.query_one("#train-run", Select)
        current = select.value
        options = [(f"{r['id']} · {r.get('state', '?')} · {(r.get('counts') or {}).get('done', 0)} done", r["id"])
                   for r in runs]
        select.set_options(options)
        ids = [r["id"] for r in runs]
        if current in ids:
            select.value = current
        elif ids:
            select.value = ids[0]

    @on(Select.Changed, "#train-recipe")
    def _describe_recipe(self, _event: Select.Changed | None = None) -> None:
        from tapdeck.runner.recipes import get_recipe

        if self.job is not None and self.job.state == "running":
            return
        recipe = get_recipe(str(self.query_one("#train-recipe", Select).value))
        missing = recipe.missing()
        where = "can start here" if not missing else f"needs {', '.join(missing)} ({recipe.where})"
        weights = "updates weights" if recipe.updates_weights else "does not update weights"
        self._state(f"{recipe.name}: {weights}; {where}")

    def _state(self, text: str) -> None:
        self.query_one("#train-state", Static).update(text)

    # -- launch / stop ------------------------------------------------------------------------------
    @on(Button.Pressed, "#train-launch")
    def action_launch(self) -> None:
        if self.job is not None and self.job.state == "running":
            self.notify("a training run is already running; stop it first", severity="warning")
            return
        run = self.query_one("#train-run", Select).value
        if run is Select.NULL:
            self.notify("pick a rollout run first (Runs screen starts one)", severity="warning")
            return
        self.launch(str(self.query_one("#train-recipe", Select).value), str(run))

    @work(group="train-launch", exclusive=True, exit_on_error=False)
    async def launch(self, recipe: str, run_id: str) -> None:
        """Export the run's rows through the server, then start the recipe on them."""
        from tapdeck.runner.training import TRACKIO_PROJECT, TrainingRun

        self._state(f"exporting {run_id}…")
        if recipe == "data-check":
            export = await self.client.export_run(run_id, "jsonl")
            path = Path(export["path"])
            if not path.is_file():
                raise FileNotFoundError(f"the export {path} is not on this machine (attached to a remote "
                                        "server?): run `tapdeck train` there")
            args = ["--rows", str(path)]
            if self._data_dir is None and getattr(self.app, "data_dir", None) is None \
                    and path.parent.parent.name == "runs":
                # The server writes <data_dir>/runs/<id>/export.jsonl: train beside the run it used.
                self._data_dir = path.parents[2]
        else:
            args = ["--run", run_id]
        log = self.query_one("#train-log", Log)
        log.clear()
        self.points, self.metric = {}, None
        self.query_one("#train-metric", Select).set_options([])
        self.job = TrainingRun(recipe, args, data_dir=self.data_dir, on_line=self._line_from_thread)
        self.job.start()
        self.query_one("#train-stop", Button).disabled = False
        self._state(f"{self.job.run_id} · {recipe} · running · {self.job.run_dir}")
        self.follow_metrics(self.job.trackio_dir, TRACKIO_PROJECT, self.job.run_id)

    def _line_from_thread(self, text: str) -> None:
        self.app.call_from_thread(self.query_one("#train-log", Log).write_line, text)

    @on(Button.Pressed, "#train-stop")
    def action_stop(self) -> None:
        if self.job is None or self.job.state != "running":
            return
        self._state(f"{self.job.run_id} · stopping…")
        self.stop_job()

    @work(group="train-stop", exclusive=True, thread=True, exit_on_error=False)
    def stop_job(self) -> None:
        """SIGTERM, then SIGKILL the recipe's process group (blocking: a thread)."""
        self.job.stop(grace_s=5.0)

    # -- metrics ------------------------------------------------------------------------------------
    @work(group="train-metrics", exclusive=True, thread=True, exit_on_error=False)
    def follow_metrics(self, trackio_dir: Path, project: str, run_name: str) -> None:
        """Poll the run's trackio database at ~1 Hz until the run ended and its last rows are read."""
        from tapdeck.runner.trackio_reader import TrackioReader

        worker = get_current_worker()
        reader = TrackioReader(trackio_dir, project)
        job = self.job
        while not worker.is_cancelled:
            ended = job.state != "running"
            points = [p for p in reader.read_new() if p.run_name == run_name]
            if points:
                self.app.call_from_thread(self._add_points, points)
            if ended:
                self.app.call_from_thread(self._finished, job)
                return
            time.sleep(POLL_S)

    def _add_points(self, points: list[Any]) -> None:
        known = set(self.points)
        for p in points:
            self.points.setdefault(p.name, []).append((p.step, p.value))
        if set(self.points) != known:
            select = self.query_one("#train-metric", Select)
            select.set_options([(name, name) for name in sorted(self.points)])
            if self.metric is None:
                self.metric = next((m for m in PREFERRED_METRICS if m in self.points), sorted(self.points)[0])
            select.value = self.metric
        self._plot()

    @on(Select.Changed, "#train-metric")
    def _metric_changed(self, event: Select.Changed) -> None:
        if event.value is not Select.NULL and event.value != self.metric:
            self.metric = str(event.value)
            self._plot()

    def _plot(self) -> None:
        widget = self.query_one("#train-plot", PlotextPlot)
        plt = widget.plt
        plt.clear_data()
        plt.clear_figure()
        if self.metric and self.points.get(self.metric):
            xs, ys = zip(*self.points[self.metric])
            plt.plot(list(xs), list(ys), marker="braille")
            plt.title(f"{self.metric} (last {ys[-1]:.4g})")
            plt.xlabel("step")
        widget.refresh()

    def _finished(self, job: Any) -> None:
        self.query_one("#train-stop", Button).disabled = True
        self._state(f"{job.run_id} · {job.recipe.name} · {job.state} (exit code {job.exit_code}) · "
                    f"log {job.log_path}")
        severity = "information" if job.state == "finished" else "warning"
        self.notify(f"training run {job.run_id} {job.state} (exit code {job.exit_code})", severity=severity)
