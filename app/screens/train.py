"""Train: launch a recipe as a job of the server, list its jobs, follow the log and trackio
metrics of the one picked, stop it.

Everything goes through the server API (`/admin/train`: recipes, launch, SSE of log/metrics/state,
stop), so the recipe runs on the server's machine and this screen works the same embedded and
under `tapdeck attach`. The plots show what TRL logs (reward and its std, loss, KL and clip
ratios, tokens per second and per step) as the server reads them from the run's trackio database,
with the held-out eval's verifier reward before and after training as points on the reward plot; a
last panel lists the reward per task. Above them, one line gives the sampler–trainer logprob
mismatch per step.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterable

from rich.text import Text
from textual import on, work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.notifications import SeverityLevel
from textual.widget import Widget
from textual.widgets import Button, DataTable, Input, RichLog, Select, Static

from tapdeck.app.client import ApiError
from tapdeck.app.eval_reward import TRAIN_TASK, Estimate, eval_reward, task_rewards
from tapdeck.app.mismatch_line import mismatch_line
from tapdeck.app.screens.base import TapdeckScreen
from tapdeck.app.table_rows import cursor_key, show_rows
from tapdeck.app.views.errors import describe_error
from tapdeck.app.widgets.metric_plot import POINT_MARKER, IntervalPoint, MetricPlot
from tapdeck.schema.runs import RunSummary
from tapdeck.schema.train import (
    MetricRow,
    RecipeInfo,
    TrainLogEvent,
    TrainMetricsEvent,
    TrainRunInfo,
)

PANELS: dict[str, tuple[str, ...]] = {
    "reward": ("train/reward", "train/reward_std"),
    "loss": ("train/loss",),
    "kl/clip": (
        "train/kl",
        "train/clip_ratio/region_mean",
        "train/clip_ratio/low_mean",
        "train/clip_ratio/high_mean",
    ),
    "tokens/s": ("train/perf/trained_tok_s_wall_clock", "train/rollout/sampled_tok_s"),
    "tokens/step": ("train/batch/trained_tokens_per_step",),
}
"""Plot panels: each draws those of its metrics the run logged (TRL's names under trackio's `train/`)."""

TASKS = "tasks"
"""The panel after the plots: a table of the reward per task (`eval_reward.task_rewards`)."""
EVAL_LABEL = "eval (95% CI)"
"""The reward plot's legend entry for the eval points (`eval_reward.eval_reward`)."""

JOBS_POLL_S = 5.0
"""While a job the screen does not follow is running, the job list is asked again this often: its
row must not read "running" once it has ended."""


def fmt_started(started_at: float) -> str:
    """A job's start as local month-day and time (a job list spans days)."""
    return time.strftime("%m-%d %H:%M", time.localtime(started_at))


class TrainScreen(TapdeckScreen):
    """Launch a training recipe on the server; live log and metric plots; stop it."""

    MODE = "train"
    HELP = (
        "Train: choose a recipe (and, for data-check, a rollout run), extra recipe arguments "
        "if any, then l (or Launch): the recipe runs on the server's machine. The jobs table "
        "lists the server's training jobs, newest first: the highlighted one's log and plots "
        "show below. s stops it "
        "(SIGTERM, then SIGKILL of its process group). p cycles the plot: reward (with the held-out "
        "eval's verifier reward before and after training as points, their 95% intervals as bars), "
        "loss, KL/clip, tokens/s, tokens/step, then tasks: per task, the training rollouts and "
        "their mean verifier reward, and the eval before → after. data-check only checks and "
        "scores rows; cpu-grpo trains SmolLM2 "
        "here (minutes per step); grpo-trl needs a GPU box with vLLM."
    )

    BINDINGS = [
        Binding("l", "launch", "Launch", id="train.launch"),
        Binding("s", "stop", "Stop", id="train.stop"),
        Binding("p", "next_panel", "Plot", id="train.plot"),
        Binding("r", "reload", "Reload", id="train.reload"),
    ]

    DEFAULT_CSS = """
    #train-controls { height: 1; }
    #train-controls Select { width: 1fr; }
    #train-recipe { max-width: 22; }
    #train-controls Button { min-width: 8; width: auto; margin-left: 1; }
    #train-args { height: 1; border: none; padding: 0 1; }
    #train-state { height: 1; padding: 0 1; color: $text-muted; text-wrap: nowrap; text-overflow: ellipsis; }
    #train-jobs { height: auto; max-height: 4; }
    #train-no-jobs { height: 1; padding: 0 1; color: $text-muted; display: none; }
    TrainScreen.-no-jobs #train-no-jobs { display: block; }
    TrainScreen.-no-jobs #train-jobs { display: none; }
    #train-body { height: 1fr; }
    #train-panel { height: 1; }
    #train-mismatch { height: 1; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    #train-plot { height: 3fr; min-height: 5; }
    #train-tasks-view { height: 3fr; min-height: 5; display: none; }
    TrainScreen.-tasks #train-tasks-view { display: block; }
    TrainScreen.-tasks #train-plot { display: none; }
    #train-tasks-note { height: 1; padding: 0 1; color: $text-muted;
                        text-wrap: nowrap; text-overflow: ellipsis; }
    #train-tasks { height: 1fr; }
    #train-log { height: 2fr; min-height: 4; border-top: hkey $panel; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.recipes: dict[str, RecipeInfo] = {}
        self.job: TrainRunInfo | None = None
        """The shown job's latest state."""
        self.jobs: list[TrainRunInfo] = []
        """The server's training jobs, newest first, as last listed (the shown one kept current)."""
        self.points: dict[str, list[tuple[int, float]]] = {}
        self.panel = "reward"
        self._run_options: list[tuple[str, str]] = []
        self._rollout_runs: dict[str, RunSummary] = {}
        """The rollout runs the picker offers, by id, as last listed."""

    def compose_body(self) -> Iterable[Widget]:
        with Horizontal(id="train-controls"):
            yield Select([], prompt="recipe…", id="train-recipe", compact=True)
            yield Select([], prompt="rollout run…", id="train-run", compact=True)
            yield Button("Launch", id="train-launch", variant="primary", compact=True)
            yield Button("Stop", id="train-stop", variant="error", disabled=True, compact=True)
        yield Input(placeholder="recipe arguments, e.g. --steps 2", id="train-args", compact=True)
        yield Static("", id="train-state")
        jobs: DataTable[str] = DataTable(id="train-jobs", cursor_type="row")
        for label, key in (("job", "job"), ("recipe", "recipe"), ("state", "state"), ("started", "started")):
            jobs.add_column(label, key=key)
        yield jobs
        from tapdeck.app.screen_registry import key_of  # the registry imports this screen

        yield Static(
            f"no training jobs yet: pick a recipe above and press "
            f"{key_of(self.app, 'train.launch', self)} (Launch) to start one",
            id="train-no-jobs",
        )
        with Vertical(id="train-body"):
            yield Select(
                [(name, name) for name in (*PANELS, TASKS)],
                value=self.panel,
                allow_blank=False,
                id="train-panel",
                compact=True,
            )
            # Whatever the panel: a step where the sampler and the trainer part stands out.
            yield Static("", id="train-mismatch")
            yield MetricPlot(id="train-plot")
            with Vertical(id="train-tasks-view"):
                yield Static("", id="train-tasks-note")
                tasks: DataTable[str] = DataTable(id="train-tasks", cursor_type="row")
                for label, key in (
                    ("task", "task"),
                    ("train n", "n"),
                    ("train reward", "reward"),
                    ("eval before", "before"),
                    ("eval after", "after"),
                ):
                    tasks.add_column(label, key=key)
                yield tasks
            # Wrapped: a recipe's long lines (paths, tracebacks) must read whole at 80 columns.
            yield RichLog(id="train-log", max_lines=2000, wrap=True)

    def on_mount(self) -> None:
        self._plot()  # says "nothing logged yet" until a run's metrics arrive
        self.action_reload()
        self.set_interval(JOBS_POLL_S, self._poll_jobs)

    @property
    def running(self) -> bool:
        """The shown job is still running."""
        return self.job is not None and self.job.state == "running"

    def _live_job(self) -> TrainRunInfo | None:
        """A job of the server's that is running, as last listed (the shown one as it is now)."""
        return next((j for j in self.jobs if j.state == "running"), None)

    # -- choices ------------------------------------------------------------------------------------
    def action_reload(self) -> None:
        self.load_choices()

    @work(group="train-choices", exclusive=True, exit_on_error=False)
    async def load_choices(self) -> None:
        """Recipes (with what the server's machine can start), rollout runs, and a live training run."""
        try:
            recipes = await self.client.train_recipes()
            runs = await self.client.runs()
            jobs = await self.client.train_runs()
        except ApiError as exc:
            self._state(f"cannot reach the training API: {describe_error(exc)}")
            return
        self.recipes = {r.name: r for r in recipes}
        recipe_select = self.query_one("#train-recipe", Select)
        current = recipe_select.value
        # Set here, not picked: no Select.Changed, whose recipe description would replace the shown
        # job's ended line (when the job's log came first). With no job shown it is described below.
        with recipe_select.prevent(Select.Changed):
            recipe_select.set_options([(name, name) for name in self.recipes])
            first = next(iter(self.recipes), Select.NULL)
            recipe_select.value = current if current in self.recipes else first
        self._show_rollout_runs(runs)
        self._show_jobs(jobs)
        if self.job is None and self.jobs:
            # A job launched earlier (or from another client) that runs, else the newest one.
            self.open_job(self._live_job() or self.jobs[0])
        elif not self.running:
            self._describe_recipe()

    def _show_jobs(self, jobs: list[TrainRunInfo]) -> None:
        """Fill the jobs table, newest first; the shown job keeps its row and its latest state."""
        known = {j.id: j for j in jobs}
        if self.job is not None and self.job.id in known and known[self.job.id].state != "running":
            self.job = known[self.job.id]  # it ended while another job was followed
        if self.job is not None:
            known[self.job.id] = self.job  # as its own events last said
        self.jobs = sorted(known.values(), key=lambda j: j.started_at, reverse=True)
        # No jobs: a line saying how to start one, not the table's bare header.
        self.set_class(not self.jobs, "-no-jobs")
        show_rows(
            self.query_one("#train-jobs", DataTable),
            {j.id: (j.id, j.recipe, j.state, fmt_started(j.started_at)) for j in self.jobs},
        )

    def _poll_jobs(self) -> None:
        live = self._live_job()
        if live is not None and (self.job is None or live.id != self.job.id):
            self.load_jobs()

    @work(group="train-jobs", exclusive=True, exit_on_error=False)
    async def load_jobs(self) -> None:
        """List the server's training jobs again (one launched or ended meanwhile shows)."""
        self._show_jobs(await self.client.train_runs())

    @on(DataTable.RowHighlighted, "#train-jobs")
    def _job_highlighted(self) -> None:
        # The cursor's job now, not the event's: laying the rows out again highlights the first
        # row on the way to the kept one.
        key = cursor_key(self.query_one("#train-jobs", DataTable))
        job = next((j for j in self.jobs if j.id == key), None)
        if job is not None and (self.job is None or job.id != self.job.id):
            self.open_job(job)

    def open_job(self, job: TrainRunInfo) -> None:
        """Show one job: its log and plots from the start, followed live while it runs."""
        self.job = job
        table = self.query_one("#train-jobs", DataTable)
        if job.id in table.rows and cursor_key(table) != job.id:
            table.move_cursor(row=table.get_row_index(job.id))
        if job.state == "running":
            self.follow(job.id)
        else:
            self.query_one("#train-stop", Button).disabled = True
            self._clear()
            self._state(f"{job.id} · {job.recipe} · loading its log…")
            self.show_ended(job)

    def _show_rollout_runs(self, runs: list[RunSummary]) -> None:
        runs = sorted(runs, key=lambda r: r.created_at, reverse=True)
        self._rollout_runs = {r.id: r for r in runs}
        run_select = self.query_one("#train-run", Select)
        chosen = run_select.value
        options = [(f"{r.id} · {r.state} · {r.counts.done} done", r.id) for r in runs]
        if options == [(str(label), value) for label, value in self._run_options]:
            return  # unchanged: keep the open picker as it is
        self._run_options = options
        run_select.set_options(options)
        ids = [r.id for r in runs]
        if chosen in ids:
            run_select.value = chosen
        elif ids:
            run_select.value = ids[0]

    def on_screen_resume(self) -> None:
        self.load_rollout_runs()

    def runs_changed(self) -> None:
        """Called by the App on (coalesced) run events: the run picker follows them."""
        if self.is_mounted:
            self.load_rollout_runs()

    @work(group="train-runs", exclusive=True, exit_on_error=False)
    async def load_rollout_runs(self) -> None:
        """The rollout runs the picker offers (a run started since shows without `r`)."""
        self._show_rollout_runs(await self.client.runs())

    @work(group="train-follow", exclusive=True, exit_on_error=False)
    async def show_ended(self, job: TrainRunInfo) -> None:
        """An ended job's log tail and metrics (it stops following any other job)."""
        try:
            log = await self.client.train_log(job.id)
            metrics = await self.client.train_metrics(job.id)
        except ApiError as exc:
            self._state(f"{job.id}: {describe_error(exc)}")
            return
        self._write_log(log.lines)
        self._add_points(metrics.points)
        self._state(self._ended_line(job))

    @on(Select.Changed, "#train-recipe")
    def _describe_recipe(self, event: Select.Changed | None = None) -> None:
        if self.running or (event is not None and self.job is not None and event.value == self.job.recipe):
            return  # the line says how the shown run of this recipe went
        recipe = self.recipes.get(str(self.query_one("#train-recipe", Select).value))
        if recipe is None:
            return
        weights = "updates weights" if recipe.updates_weights else "does not update weights"
        where = "can start on the server" if recipe.available else recipe.why
        if recipe.available and "; " in recipe.why:
            # What follows "runs in PYTHON; " is the server's GPU split for a GPU recipe.
            where += f": {recipe.why.partition('; ')[2]}"
        self._state(f"{recipe.name}: {weights}; {where}")

    def _state(self, text: str) -> None:
        self.query_one("#train-state", Static).update(text)

    # -- launch / stop ------------------------------------------------------------------------------
    @on(Button.Pressed, "#train-launch")
    def action_launch(self) -> None:
        if (live := self._live_job()) is not None:
            self.notify(
                f"training job {live.id} ({live.recipe}) is already running; stop it first",
                severity="warning",
            )
            return
        name = self.query_one("#train-recipe", Select).value
        recipe = self.recipes.get(str(name))
        if recipe is None:
            self.notify(
                "no recipe chosen: pick one"
                if self.recipes
                else "no recipe to launch: the server lists none",
                severity="warning",
            )
            return
        if not recipe.available:
            # As the server reports it (a GPU recipe on a machine without GPUs, a training
            # environment not made): a launch would only be refused, after a round trip.
            self._state(f"{recipe.name} did not start: {recipe.why}")
            self.notify(
                f"{recipe.name} cannot start on the server's machine: {recipe.why} (r checks again)",
                severity="warning",
            )
            return
        try:
            args = shlex.split(self.query_one("#train-args", Input).value)
        except ValueError as exc:
            self.notify(f"recipe arguments: {exc}", severity="error")
            return
        run = self.query_one("#train-run", Select).value
        run_id = None if run is Select.NULL or not recipe.uses_run else str(run)
        if (why := recipe.rows_missing(run_id, args)) is not None:
            self.notify(f"pick a rollout run first (Setup starts one): {why}", severity="warning")
            return
        going = self._rollout_runs.get(run_id) if run_id else None
        if going is not None and going.state == "running":
            # Allowed (a first look at a long batch), but it reads only what has finished so far.
            self.notify(
                f"run {run_id} is still going: {recipe.name} reads the "
                f"{going.counts.done} of {going.counts.total} rollouts done so far",
                severity="warning",
            )
        self.launch(recipe.name, run_id, args)

    @work(group="train-launch", exclusive=True, exit_on_error=False)
    async def launch(self, recipe: str, run_id: str | None, args: list[str]) -> None:
        """Ask the server to start the recipe, then follow it."""
        self._state(f"launching {recipe}…")
        try:
            job = await self.client.start_train(recipe, run=run_id, args=args)
        except ApiError as exc:
            self._state(f"{recipe} did not start: {describe_error(exc)}")
            self.notify(describe_error(exc), title=f"{recipe} did not start", severity="error")
            return
        self._show_jobs([job, *self.jobs])
        self.open_job(job)

    def _clear(self) -> None:
        """Empty the log and the plots (another job is shown)."""
        self.query_one("#train-log", RichLog).clear()
        self.points = {}
        self._plot()

    def follow(self, run_id: str) -> None:
        """Reset the log and plots and follow one run's events."""
        self._clear()
        self.query_one("#train-stop", Button).disabled = False
        self._state(f"{run_id} · starting…")
        self.follow_events(run_id)

    @work(group="train-follow", exclusive=True, exit_on_error=False)
    async def follow_events(self, run_id: str) -> None:
        """Apply the run's SSE events (log, metrics, state) until it ends."""
        try:
            async for event in self.client.train_events(run_id):
                if isinstance(event, TrainLogEvent):
                    self._write_log(event.lines)
                elif isinstance(event, TrainMetricsEvent):
                    self._add_points(event.points)
                else:
                    self._show_job(event.run)
        except ApiError as exc:
            self._state(f"{run_id}: lost the event stream ({describe_error(exc)}); r reloads")

    def _write_log(self, lines: list[str]) -> None:
        log = self.query_one("#train-log", RichLog)
        for line in lines:
            log.write(Text(line))  # plain text: a recipe's output is not markup

    def _show_job(self, job: TrainRunInfo) -> None:
        self.job = job
        self._show_jobs(self.jobs)  # its row says its state too
        if job.state == "running":
            self._state(f"{job.id} · {job.recipe} · running (pid {job.pid}) on the server")
            return
        self.query_one("#train-stop", Button).disabled = True
        self._state(self._ended_line(job))
        why = f" · {job.error}" if job.error else ""
        severity: SeverityLevel = "information" if job.state == "finished" else "warning"
        self.notify(f"training run {job.id} {job.state}{why}", severity=severity)

    @staticmethod
    def _ended_line(job: TrainRunInfo) -> str:
        why = f" · {job.error}" if job.error else ""
        return f"{job.id} · {job.recipe} · {job.state} (exit code {job.exit_code}){why}"

    @on(Button.Pressed, "#train-stop")
    def action_stop(self) -> None:
        if self.job is None or not self.running:
            self.notify("no training run is running here: nothing to stop", severity="information")
            return
        self._state(f"{self.job.id} · stopping…")
        self.stop_job(self.job.id)

    @work(group="train-stop", exclusive=True, exit_on_error=False)
    async def stop_job(self, run_id: str) -> None:
        """`POST /admin/train/{id}/stop`; the event stream then reports the final state."""
        try:
            await self.client.stop_train(run_id)
        except ApiError as exc:
            self.notify(f"stop failed: {describe_error(exc)}", severity="error")

    # -- plots --------------------------------------------------------------------------------------
    def _add_points(self, points: list[MetricRow]) -> None:
        for p in points:
            self.points.setdefault(p.name, []).append((p.step, p.value))
        self._plot()

    def action_next_panel(self) -> None:
        names = [*PANELS, TASKS]
        self.query_one("#train-panel", Select).value = names[(names.index(self.panel) + 1) % len(names)]

    @on(Select.Changed, "#train-panel")
    def _panel_changed(self, event: Select.Changed) -> None:
        if event.value is not Select.NULL and event.value != self.panel:
            self.panel = str(event.value)
            self._plot()

    def shown_metrics(self) -> list[str]:
        """The current panel's metrics that the run has logged."""
        return [m for m in PANELS.get(self.panel, ()) if self.points.get(m)]

    def _plot(self) -> None:
        self.query_one("#train-mismatch", Static).update(Text(mismatch_line(self.points)))
        self.set_class(self.panel == TASKS, "-tasks")
        if self.panel == TASKS:
            self._show_tasks()
            return
        shown = self.shown_metrics()
        ev = eval_reward(self.points) if self.panel == "reward" else None
        if shown:
            first = shown[0].removeprefix("train/")
            label = self.panel if first == self.panel else f"{self.panel}: {first}"  # not "reward: reward"
            title = f"{label}, last {self.points[shown[0]][-1][1]:.4g}"
        else:
            title = self.panel if ev else f"{self.panel}: nothing logged yet"
        marks: dict[str, list[IntervalPoint]] = {}
        if ev is not None:
            evals = [e for e in (ev.before, ev.after) if e is not None]
            marks[EVAL_LABEL] = [IntervalPoint(e.step, e.value, e.low, e.high) for e in evals]
            # The title names the marks too: at 80×24 plotext has no room for the legend.
            ci = " (│ 95% CI)" if any(e.low is not None and e.high is not None for e in evals) else ""
            title += f" · {POINT_MARKER} eval " + " → ".join(f"{e.value:.2f}" for e in evals) + ci
        self.query_one("#train-plot", MetricPlot).show(
            {name.removeprefix("train/"): self.points[name] for name in shown}, title, marks
        )

    def _show_tasks(self) -> None:
        """The tasks panel: per task, its training rollouts and their mean verifier reward over the
        run, and its eval before → after."""
        rows = task_rewards(self.points)

        def cell(e: Estimate | None) -> str:
            # No interval: a task's few eval rollouts give a wide one, and 80 columns have no room.
            return "–" if e is None else f"{e.value:.2f}" + ("" if e.n is None else f" (n {e.n})")

        show_rows(
            self.query_one("#train-tasks", DataTable),
            {
                r.task: (
                    r.task,
                    str(r.train_n) if r.train_n else "–",
                    "–" if r.train_reward is None else f"{r.train_reward:.2f}",
                    cell(r.eval_before),
                    cell(r.eval_after),
                )
                for r in rows
            },
        )
        steps = {s for name, pts in self.points.items() if name.startswith(TRAIN_TASK) for s, _ in pts}
        note = (
            f"verifier reward per task: training mean over {len(steps)} step(s); eval before → after"
            if rows
            else "reward per task: not logged by this run (cpu-grpo logs it with its held-out eval)"
        )
        self.query_one("#train-tasks-note", Static).update(note)
