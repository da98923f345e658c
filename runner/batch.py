"""Batches: N tasks × K rollouts per task (one GRPO group per task), C at a time, resumable.

A run lives in `<data_dir>/runs/<run_id>/` (its files: `run_dir.py`); its plan is resolved before
it is made (`plan_resolution.py`). A run whose process died shows as `interrupted`; `resume` runs exactly the
rollouts that have no finished line in `results.jsonl` (a cancelled rollout is not finished), and refuses a
run with a line holding a result this version cannot read (another version's schema) rather than run that
rollout again. Progress is published on the capture service's event bus (`run_started`,
`rollout_updated`, `run_finished`).
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import logging
import shutil
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from tapdeck.proxy.errors import ProxyError
from tapdeck.proxy.upstream.address import shown_url
from tapdeck.proxy.upstream.default_engine import DefaultEngine
from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.runner.engines import EMBEDDED, EngineChoiceError, is_embedded, resolve_engine
from tapdeck.runner.errors import (
    PlanError,
    RolloutNotFound,
    RolloutNotRunning,
    RunElsewhere,
    RunNotFound,
    RunNotStartable,
    RunUnreadable,
    SandboxUnavailable,
)
from tapdeck.runner.plan_resolution import check_sandbox, resolve_tasks
from tapdeck.runner.rollout import RolloutSpec, run_rollout
from tapdeck.runner.run_dir import (
    PLAN,
    RESULTS,
    STATE,
    append_result,
    is_run_id,
    new_run_id,
    read_json,
    read_plan,
    read_results,
    rollout_id,
    write_json,
)
from tapdeck.runner.run_lock import RunLock
from tapdeck.runner.runner_loop import LoopTask, RunnerLoop, ServiceOnItsLoop
from tapdeck.runner.sandboxes.live_sandboxes import LiveSandbox, LiveSandboxes
from tapdeck.runner.service_protocol import CaptureServiceProtocol
from tapdeck.schema.events import RolloutUpdated, RunFinished, RunStarted
from tapdeck.schema.rollout_health import degenerate_reasons
from tapdeck.schema.runs import (
    NO_ENGINE,
    RERUN_ON_RESUME,
    RolloutResult,
    RunCounts,
    RunPlan,
    RunState,
    RunSummary,
    mean_reward,
    pass_rate,
)

log = logging.getLogger("tapdeck.runner")


class _Run:
    """A run's in-process state."""

    def __init__(
        self,
        run_id: str,
        path: Path,
        plan: RunPlan,
        tasks: list[dict[str, str]],
        created_at: float,
        left_out: list[str],
    ) -> None:
        self.id = run_id
        self.path = path
        self.plan = plan
        self.tasks = tasks
        self.created_at = created_at
        self.left_out = left_out
        """Task folders of the dataset that are not tasks Harbor can run, as `file: why`."""
        self.lock = RunLock(path)
        """Held by this process while it runs the run (so others see it running, not interrupted)."""
        self.elsewhere: int | None = None
        """The pid of another process running the run when it was read (0: one not yet named)."""
        self.state: RunState = "interrupted"
        self.finished_at: float | None = None
        self.error: str | None = None
        self.results: dict[str, RolloutResult] = {}
        self.live: dict[str, RolloutResult] = {}
        self.task: asyncio.Task[Any] | LoopTask[Any] | None = None
        self.rollout_tasks: dict[str, asyncio.Task[None]] = {}
        self.cancel_requested: set[str] = set()
        """Rollouts cancelled one by one (the rest of the run goes on)."""
        self.unreadable: list[str] = []
        """Lines of results.jsonl that hold a result this version cannot read (`file:line: why`)."""
        self.engine_used: str | None = None
        """`RunSummary.engine_used`: the engine its rollouts last started on."""
        self.engine_model: str | None = None
        """`RunSummary.engine_model_used`: the model name those rollouts' calls named."""

    def rollout_ids(self) -> list[tuple[int, int, str]]:
        return [(g, i, rollout_id(self.id, g, i)) for g in range(len(self.tasks)) for i in range(self.plan.k)]

    def all_rollouts(self) -> list[RolloutResult]:
        out = []
        for g, i, rid in self.rollout_ids():
            out.append(
                self.live.get(rid)
                or self.results.get(rid)
                or RolloutResult(rollout_id=rid, run_id=self.id, task=self.tasks[g]["name"], group=g, index=i)
            )
        return out


def _cancel_if_started(task: asyncio.Task[None]) -> None:
    """Cancel a rollout's task once it has started; one not yet started sees its cancel request
    when it starts (and records a plain `cancelled` result)."""
    coro = task.get_coro()
    assert coro is not None, "only an eagerly run task has none, and rollouts' tasks are not eager"
    if inspect.getcoroutinestate(coro) != inspect.CORO_CREATED:
        task.cancel()


def _model_of(engine: EngineSpec | None) -> str | None:
    return engine.model if engine is not None else None


def summarize(run: _Run) -> RunSummary:
    """Counts, mean reward, pass rate and failures by cause for a run."""
    rollouts = run.all_rollouts()
    finished = [r for r in rollouts if r.rollout_id in run.results and r.rollout_id not in run.live]
    failures = Counter(r.error_kind or "not_ok" for r in finished if not r.ok)
    counts = RunCounts(
        total=len(rollouts),
        done=len(finished),
        ok=sum(r.ok for r in finished),
        failed=sum(not r.ok for r in finished),
        running=len(run.live),
        degenerate=sum(bool(degenerate_reasons(r.findings)) for r in finished),
    )
    return RunSummary(
        id=run.id,
        state=run.state,
        plan=run.plan,
        created_at=run.created_at,
        finished_at=run.finished_at,
        counts=counts,
        mean_reward=mean_reward(r.reward for r in finished),
        pass_rate=pass_rate(r.reward for r in finished),
        failures=dict(failures),
        error=run.error,
        path=str(run.path),
        left_out=run.left_out,
        engine_used=run.engine_used,
        engine_model_used=run.engine_model,
    )


RolloutFn = Callable[..., Awaitable[RolloutResult]]


class BatchRunner:
    """Creates, runs, resumes, cancels and lists runs on one capture service.

    Runs execute on `loop` (the runner's own asyncio loop, apart from the server's) when given,
    else on the loop that starts them. `service` None: a runner that reads runs (the CLI's), or
    whose `rollout_fn` needs no capture service."""

    def __init__(
        self,
        service: CaptureServiceProtocol | None,
        *,
        data_dir: Path,
        default_engine: DefaultEngine | EngineSpec | None,
        rollout_fn: RolloutFn = run_rollout,
        loop: RunnerLoop | None = None,
        default_is_embedded: bool = False,
    ) -> None:
        self.service = service
        self.data_dir = Path(data_dir)
        self.runs_dir = self.data_dir / "runs"
        self.default_engine = DefaultEngine.of(default_engine)
        """The server's default engine (the capture service's own), or why not yet."""
        self.default_is_embedded = default_is_embedded
        """Whether `default_engine` is the embedded engine (else an engine URL the server was given)."""
        self._rollout_fn = rollout_fn
        self._loop = loop
        self._runs: dict[str, _Run] = {}
        self._runs_lock = threading.Lock()
        """Guards `_runs`: `list` loads runs on a worker thread while requests load them on others."""
        self._skipped: dict[str, str] = {}
        """Runs `list` leaves out, and why: each is warned about once, not on every poll."""
        self.sandboxes = LiveSandboxes()
        """The sandboxes of the rollouts running here, while their agents run."""

    # ----------------------------------------------------------------- plan → run directory

    async def create(self, plan: RunPlan) -> RunSummary:
        """Resolve the plan's tasks and engine, write the run directory; nothing runs yet."""
        tasks, left_out = await asyncio.to_thread(resolve_tasks, plan)
        # Refuse a bad engine, model or sandbox choice before anything is written.
        engine = self._engine(plan)
        if engine is not None:
            await self._check_model(engine)
        await asyncio.to_thread(check_sandbox, plan)
        run_id = new_run_id()
        path = self.runs_dir / run_id
        (path / "trials").mkdir(parents=True, exist_ok=False)
        created = time.time()
        write_json(
            path / PLAN,
            {
                "id": run_id,
                "created_at": created,
                "plan": plan.model_dump(mode="json"),
                "tasks": tasks,
                "left_out": left_out,
            },
        )
        run = _Run(run_id, path, plan, tasks, created, left_out)
        run.engine_used, run.engine_model = self._engine_used(engine), _model_of(engine)
        with self._runs_lock:
            self._runs[run_id] = run
        self._write_state(run, "running")
        return summarize(run)

    def _engine(self, plan: RunPlan) -> EngineSpec | None:
        from tapdeck.runner.harnesses import get_harness

        try:
            if not get_harness(plan.rollout.harness).makes_model_calls:
                return None
        except KeyError as exc:
            raise PlanError(str(exc).strip("'\"")) from exc
        template = plan.rollout
        # A run on the default engine while the server still waits for it: a 503 with
        # Retry-After (EngineLoading), as a session on it gets.
        default = self.default_engine.get() if is_embedded(template.engine) else None
        try:
            return resolve_engine(
                template.engine,
                model=template.engine_model,
                default=default,
                tool_parser=template.engine_tool_parser,
                reasoning_parser=template.engine_reasoning_parser,
            )
        except EngineChoiceError as exc:
            raise PlanError(str(exc)) from exc

    def _resumed_engine(self, run: _Run) -> EngineSpec | None:
        """The engine the run's rollouts call when it (re)starts: the plan's, unless the run
        recorded another (its plan's "embedded" named the default engine of a server started with
        another engine): then the recorded engine and model again, since the rollouts of one run
        must come from one engine. RunNotStartable for an embedded-engine run on a server whose
        default engine is a URL (it has no embedded engine to call), or a plan this server refuses."""
        try:
            engine = self._engine(run.plan)
        except PlanError as exc:  # the plan was taken when the run was made: this server refuses it
            raise RunNotStartable(exc.message) from exc
        used, model = run.engine_used, run.engine_model
        if engine is None or used is None or used == NO_ENGINE:
            return engine  # a run an older tapdeck wrote: which engine it called is not known
        if self._engine_used(engine) == used:
            return (
                engine
                if model is None or engine.model == model
                else engine.model_copy(update={"model": model})
            )
        if used == EMBEDDED:
            raise RunNotStartable(
                f"run {run.id}'s rollouts called the embedded engine and this server's "
                f"engine is {shown_url(engine.base_url)}: resume it on a server started "
                "without --engine, so that all its rollouts come from one engine"
            )
        template = run.plan.rollout
        try:
            return resolve_engine(
                used,
                model=model,
                tool_parser=template.engine_tool_parser,
                reasoning_parser=template.engine_reasoning_parser,
            )
        except EngineChoiceError as exc:  # a run.json edited by hand
            raise RunNotStartable(f"run {run.id} records an engine that is not an address: {exc}") from None

    def _engine_used(self, engine: EngineSpec | None) -> str:
        """What `RunSummary.engine_used` says of a run whose rollouts call `engine`."""
        if engine is None:
            return NO_ENGINE
        default = self.default_engine.spec
        if self.default_is_embedded and default is not None and engine.base_url == default.base_url:
            return EMBEDDED
        return engine.base_url

    async def _check_model(self, engine: EngineSpec) -> None:
        """A model name the engine does not list is refused, naming the ones it does. An engine
        that does not answer now is left to the rollouts (each then ends `engine_unreachable`)."""
        from tapdeck.proxy.upstream.address import EngineAddressError, settle

        if engine.model is None or engine is self.default_engine.spec:
            return
        try:
            settled = await settle(engine.url, api_key=engine.api_key)
        except EngineAddressError:
            return
        try:
            settled.require_model(engine.model)
        except EngineAddressError as exc:
            raise PlanError(exc.message) from None

    # ----------------------------------------------------------------- execution

    def start(self, run_id: str) -> asyncio.Task[RunSummary] | LoopTask[RunSummary]:
        """Run (or resume) a run as a task on the runner's loop, or on the running one; returns
        at once."""
        run = self._load(run_id)
        if run.task is not None and not run.task.done():
            raise RunNotStartable(f"run {run_id} is already running")
        if (pid := run.lock.claim()) is not None:
            raise RunElsewhere(run_id, pid)
        try:
            self._check_results(run)
            self._resumed_engine(run)
        except (PlanError, ProxyError):  # ProxyError: EngineLoading, the default engine not up yet
            run.lock.release()
            raise
        # Running from now: the reply to a resume, and every read after it, say so before the
        # task (on another loop) gets to write it; a poll seeing "interrupted" took it as ended.
        run.state = "running"
        here = asyncio.get_running_loop()
        if self._loop is None:
            run.task = here.create_task(self.run(run_id), name=f"tapdeck-{run_id}")
        else:
            # No service (a rollout_fn that needs none): the run gets none, as on the running loop.
            service = ServiceOnItsLoop(self.service, here) if self.service is not None else None
            run.task = self._loop.spawn(self.run(run_id, service), name=f"tapdeck-{run_id}")

        def ended(_task: Any) -> None:
            # However it ends: a task cancelled before it started runs no finally, nor says how
            # it ended.
            if run.state == "running":
                run.state = "interrupted"
            run.lock.release()

        run.task.add_done_callback(ended)
        return run.task

    @staticmethod
    def _check_results(run: _Run) -> None:
        """RunNotStartable when lines of the run's results cannot be read: their rollouts finished."""
        if run.unreadable:  # read again: those lines may have been deleted since
            run.results, run.unreadable = read_results(run.path / RESULTS)
        if run.unreadable:
            # Their rollouts finished: running them again would redo work and bury their results.
            raise RunNotStartable(
                f"run {run.id} cannot resume: {len(run.unreadable)} line(s) of its "
                f"{RESULTS} hold results this tapdeck cannot read ({run.unreadable[0]}); "
                "read them with the tapdeck that wrote them, or delete those lines to "
                "run their rollouts again"
            )

    async def run(self, run_id: str, service: CaptureServiceProtocol | None = None) -> RunSummary:
        """Execute every rollout of the run that has not finished yet; returns the final summary.
        The rollouts use `service` (default: this runner's) for their capture sessions."""
        service = self.service if service is None else service
        run = self._load(run_id)
        engine = self._resumed_engine(run)
        run.engine_used, run.engine_model = self._engine_used(engine), _model_of(engine)
        self._write_state(run, "running")
        pending = [
            (g, i, rid)
            for g, i, rid in run.rollout_ids()
            if rid not in run.results or run.results[rid].error_kind in RERUN_ON_RESUME
        ]
        self._publish(RunStarted(run_id=run.id, run=summarize(run), pending=len(pending)))
        semaphore = asyncio.Semaphore(run.plan.concurrency)

        async def one(group: int, index: int, rid: str) -> None:
            result: RolloutResult | None = None
            if rid not in run.cancel_requested:
                try:
                    result = await started(group, index, rid)
                except asyncio.CancelledError:
                    if rid not in run.cancel_requested:
                        raise
                    # This rollout alone was cancelled while it waited for its turn: the run goes on.
                    current = asyncio.current_task()
                    if current is not None:
                        current.uncancel()
            if result is None:
                result = RolloutResult(
                    rollout_id=rid,
                    run_id=run.id,
                    task=run.tasks[group]["name"],
                    group=group,
                    index=index,
                    error_kind="cancelled",
                    error="cancelled before it started",
                    phase="failed",
                    finished_at=time.time(),
                )
            self._record(run, result)

        async def started(group: int, index: int, rid: str) -> RolloutResult:
            async with semaphore:
                task = run.tasks[group]
                trial_dir = run.path / "trials" / rid
                if trial_dir.exists():
                    # A crashed attempt left a partial trial behind; its result was never recorded.
                    await asyncio.to_thread(shutil.rmtree, trial_dir, True)
                spec = RolloutSpec(
                    task=task["name"],
                    task_path=Path(task["path"]),
                    trials_dir=run.path / "trials",
                    rollout=run.plan.rollout,
                    engine=engine,
                    trial_name=rid,
                    rollout_id=rid,
                    run_id=run.id,
                    group=group,
                    index=index,
                    data_dir=self.data_dir,
                    sandboxes=self.sandboxes,
                )

                def on_update(partial: RolloutResult) -> None:
                    run.live[rid] = partial
                    self._publish(RolloutUpdated(run_id=run.id, rollout=partial))

                return await self._rollout_fn(service, spec, on_update=on_update)

        run.cancel_requested.clear()
        run.rollout_tasks = {rid: asyncio.create_task(one(g, i, rid)) for g, i, rid in pending}
        tasks = list(run.rollout_tasks.values())
        state: RunState = "finished"
        try:
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            state = "cancelled"
            for t in tasks:
                t.cancel()
            # Let started rollouts record their cancelled results and tear their sandboxes down.
            await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))
        except Exception as exc:  # noqa: BLE001 - a bug in the batch machinery itself: say so on the run
            state = "failed"
            run.error = f"{type(exc).__name__}: {exc}"
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            run.live.clear()
            run.rollout_tasks.clear()
            run.finished_at = time.time()
            self._write_state(run, state)
            summary = summarize(run)
            self._publish(RunFinished(run_id=run.id, run=summary))
        return summary

    def running_here(self) -> list[str]:
        """The runs this process is running now."""
        with self._runs_lock:
            return [run.id for run in self._runs.values() if run.task is not None and not run.task.done()]

    def cancel(self, run_id: str) -> RunSummary:
        """Cancel a running run: started rollouts end as `cancelled` (sandboxes torn down).
        RunElsewhere for a run another process runs: only that process can stop its rollouts."""
        run = self._load(run_id)
        if run.elsewhere is not None:
            raise RunElsewhere(run_id, run.elsewhere)
        if run.task is not None and not run.task.done():
            run.task.cancel()
        elif run.state in ("running", "interrupted"):
            self._write_state(run, "cancelled")
        return summarize(run)

    def cancel_rollout(self, run_id: str, rollout_id: str) -> RolloutResult:
        """Cancel one rollout of a running run: its sandbox is torn down, its capture session
        closed and kept, its result recorded as `cancelled`; the other rollouts go on."""
        run = self._load(run_id)
        if run.elsewhere is not None:
            raise RunElsewhere(run_id, run.elsewhere)
        task = run.rollout_tasks.get(rollout_id)
        if task is None or task.done():
            known = {rid for _, _, rid in run.rollout_ids()}
            if rollout_id not in known:
                raise RolloutNotFound(run_id, rollout_id)
            raise RolloutNotRunning(rollout_id)
        run.cancel_requested.add(rollout_id)
        if self._loop is None:
            _cancel_if_started(task)
        else:  # the task's state is read on its own loop, where it cannot change meanwhile
            self._loop.call_soon(_cancel_if_started, task)
        return next(r for r in run.all_rollouts() if r.rollout_id == rollout_id)

    def live_sandbox(self, run_id: str, rollout_id: str) -> LiveSandbox:
        """The sandbox of a rollout running here now. RolloutNotFound for none of that id;
        RunElsewhere for a run another process runs (its sandboxes are that process's);
        SandboxUnavailable, saying why, for a rollout that has not started its agent or has ended."""
        run = self._load(run_id)
        if rollout_id not in {rid for _, _, rid in run.rollout_ids()}:
            raise RolloutNotFound(run_id, rollout_id)
        if run.elsewhere is not None:
            raise RunElsewhere(run_id, run.elsewhere)
        sandbox = self.sandboxes.get(rollout_id)
        if sandbox is not None:
            return sandbox
        rollout = next(r for r in run.all_rollouts() if r.rollout_id == rollout_id)
        if rollout_id in run.results and rollout_id not in run.live:
            how = "ok" if rollout.ok else (rollout.error_kind or "failed")
            raise SandboxUnavailable(f"rollout {rollout_id} has ended ({how}): its sandbox is gone")
        if rollout.phase in ("done", "failed") or "agent" in rollout.phase_started:
            # Its trial has returned (the sandbox is released then), its result not recorded yet.
            raise SandboxUnavailable(
                f"rollout {rollout_id} is ending (phase {rollout.phase}): its sandbox is gone"
            )
        if rollout_id not in run.live:
            raise SandboxUnavailable(f"rollout {rollout_id} is not running (its run is {run.state})")
        raise SandboxUnavailable(
            f"rollout {rollout_id} has no sandbox up yet (phase {rollout.phase}): "
            "try again once its agent runs"
        )

    async def wait(self, run_id: str) -> RunSummary:
        """Wait for a started run to end (cancelled or not) and return its summary."""
        run = self._load(run_id)
        if run.task is not None:
            await asyncio.gather(run.task, return_exceptions=True)
        return summarize(run)

    def _record(self, run: _Run, result: RolloutResult) -> None:
        append_result(run.path / RESULTS, result)
        run.results[result.rollout_id] = result
        run.live.pop(result.rollout_id, None)
        self._publish(RolloutUpdated(run_id=run.id, rollout=result, run=summarize(run)))

    def _publish(self, event: RunStarted | RolloutUpdated | RunFinished) -> None:
        events = getattr(self.service, "events", None)
        if events is not None:
            events.publish(event.model_dump(mode="json"))

    # ----------------------------------------------------------------- queries

    def list(self) -> list[RunSummary]:
        """Every run in the data dir, newest first. A run whose files cannot be read is left out,
        with a warning in the log (once, though the list is polled)."""
        runs: list[_Run] = []
        if self.runs_dir.is_dir():
            for path in self.runs_dir.iterdir():
                if not is_run_id(path.name) or not (path / PLAN).is_file():
                    continue
                try:
                    run = self._load(path.name)
                except RunNotFound:  # removed meanwhile
                    continue
                except (OSError, ValueError, RunUnreadable) as exc:
                    # One unreadable run (RunUnreadable) must neither fail the list nor hide the
                    # others: it is left out, and said so in the log.
                    if self._skipped.get(path.name) != str(exc):
                        self._skipped[path.name] = str(exc)
                        log.warning("run %s left out of the list: %s", path.name, exc)
                    continue
                runs.append(run)
        return sorted((summarize(r) for r in runs), key=lambda s: s.created_at, reverse=True)

    # `builtins.list` below: in the class body, `list` is the method above.
    def get(self, run_id: str) -> tuple[RunSummary, builtins.list[RolloutResult]]:
        """A run's summary and every rollout (finished, live, or still queued)."""
        run = self._load(run_id)
        return summarize(run), run.all_rollouts()

    def results(self, run_id: str) -> builtins.list[RolloutResult]:
        """The finished rollouts of a run, in plan order."""
        run = self._load(run_id)
        return [run.results[rid] for _, _, rid in run.rollout_ids() if rid in run.results]

    def _load(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is not None:
            if run.lock.held or run.lock.holder() is None:
                return run
            with self._runs_lock:  # another process has resumed it since: read it afresh
                self._runs.pop(run_id, None)
        path = self.runs_dir / run_id
        if not is_run_id(run_id) or not (path / PLAN).is_file():
            raise RunNotFound(run_id)
        run = _Run(run_id, path, *read_plan(path / PLAN))
        run.results, run.unreadable = read_results(path / RESULTS)
        state_doc = read_json(path / STATE) or {}
        state = state_doc.get("state", "running")
        run.finished_at = state_doc.get("finished_at")
        run.error = state_doc.get("error")
        run.engine_used = state_doc.get("engine_used")
        run.engine_model = state_doc.get("engine_model_used")
        if state == "running" and (pid := run.lock.holder()) is not None:
            # Another process on this data dir runs it: read again on every look, never kept, as
            # that process alone sees its rollouts and its end.
            run.state, run.elsewhere = "running", pid
            return run
        # Not running in this process but recorded as running: its process died.
        run.state = "interrupted" if state == "running" else state
        # Read outside the lock; a run another thread loaded (or started) meanwhile is the one kept.
        with self._runs_lock:
            return self._runs.setdefault(run_id, run)

    def _write_state(self, run: _Run, state: RunState) -> None:
        run.state = state
        write_json(
            run.path / STATE,
            {
                "state": state,
                "created_at": run.created_at,
                "finished_at": run.finished_at,
                "error": run.error,
                "engine_used": run.engine_used,
                "engine_model_used": run.engine_model,
            },
        )

    # ----------------------------------------------------------------- export

    def export(self, run_id: str, fmt: Literal["jsonl", "parquet"] = "jsonl") -> dict[str, Any]:
        """Write the run's training rows (one per trainable rollout, with group id and reward).

        RunSessionsMissing (409) when a rollout names a session the store does not have, as
        `tapdeck export` refuses it: a partial export would pass for the whole run."""
        from tapdeck.proxy.capture.export import check_run_sessions, write_jsonl, write_parquet

        service = self.service
        if service is None:
            raise RuntimeError(
                "exporting a run reads its sessions from the capture service; "
                "this runner was made without one"
            )
        run = self._load(run_id)
        results = self.results(run_id)
        check_run_sessions(service.store, run.id, results)
        rows: list[dict[str, Any]] = []
        skipped: dict[str, str] = {}
        for result in results:
            if result.session_id is None:
                skipped[result.rollout_id] = "no capture session"
                continue
            try:
                trace = service.training_trace(result.session_id)
            except Exception as exc:  # noqa: BLE001 - eval tier (409); a missing session was refused above
                skipped[result.rollout_id] = str(exc)
                continue
            # The result's fields last: its reward is the run's verdict (null: never graded),
            # whatever the session's metadata says.
            rows.append(
                {
                    **trace,
                    "run_id": run.id,
                    "rollout_id": result.rollout_id,
                    "task": result.task,
                    "group": result.group,
                    "index": result.index,
                    "reward": result.reward,
                    "ok": result.ok,
                    "error_kind": result.error_kind,
                    "session_id": result.session_id,
                }
            )
        path = run.path / f"export.{fmt}"
        (write_parquet if fmt == "parquet" else write_jsonl)(path, rows)
        return {"path": str(path), "rows": len(rows), "skipped": skipped}
