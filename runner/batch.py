"""Batches: N tasks × K rollouts per task (one GRPO group per task), C at a time, resumable.

A run lives in `<data_dir>/runs/<run_id>/`:
- `plan.json`     — the plan as given plus the resolved task list (name + path per group);
- `run.json`      — state (`running`/`finished`/`cancelled`/`failed`), timestamps;
- `results.jsonl` — one `RolloutResult` per finished rollout, appended and fsynced as each ends;
- `trials/`       — Harbor's trial directories.
A run whose process died shows as `interrupted`; `resume` runs exactly the rollouts that have no
finished line in `results.jsonl` (a cancelled rollout is not finished). Progress is published on the
capture service's event bus (`run_started`, `rollout_updated`, `run_finished`).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from tapdeck.proxy.config import check_public_url
from tapdeck.proxy.tiers import EngineSpec
from tapdeck.runner.engines import EngineChoiceError, resolve_engine
from tapdeck.runner.rollout import RolloutResult, RolloutSpec, run_rollout
from tapdeck.runner.rollout_settings import RolloutSettings

RunState = Literal["running", "finished", "cancelled", "failed", "interrupted"]
RESULTS = "results.jsonl"
PLAN = "plan.json"
STATE = "run.json"
UNFINISHED_KINDS = frozenset({"cancelled"})
"""Rollouts recorded with these error kinds run again on resume."""


class RunPlan(BaseModel):
    """`POST /admin/runs` body: what to run. Defaults run offline on the sample dataset."""

    dataset: str | None = None
    """A local folder, a registry name, ...; None → tapdeck's sample dataset."""
    tasks: list[str] | None = None
    """Task names to keep (None → all, or the first `n_tasks`)."""
    n_tasks: int | None = Field(default=None, ge=1)
    harness: str = "terminus-2"
    sandbox: str = "host"
    sandbox_kwargs: dict[str, Any] | None = None
    """Sandbox constructor kwargs (Harbor's `EnvironmentConfig.kwargs`)."""
    engine: str = "embedded"
    """"embedded" (the server's default engine) or an engine URL."""
    engine_model: str | None = None
    engine_tool_parser: str | None = None
    """The engine's tool-call parser (`EngineSpec.tool_call_parser`); None → the default engine's."""
    engine_reasoning_parser: str | None = None
    """The engine's reasoning parser, if it runs one (`EngineSpec.reasoning_parser`)."""
    k: int = Field(default=1, ge=1)
    """Rollouts per task (the GRPO group size)."""
    concurrency: int = Field(default=1, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)
    """Hard limit per rollout, sandbox start included (None → `DEFAULT_HARD_LIMIT_S`)."""
    reward_key: str | None = None
    settings: RolloutSettings = Field(default_factory=RolloutSettings)
    """What each rollout's agent runs with (timeouts, turns, output tokens, sampling, kwargs)."""
    call_budget: int | None = Field(default=None, ge=1)
    """Model calls per rollout before the proxy answers with a stop (None → 3 × max_turns)."""
    alternatives: int = Field(default=0, ge=0, le=20)
    """Top alternatives per sampled token to capture for inspection (0: as the harness asks)."""
    training_sampling: dict[str, Any] | None = None
    """A trainer's sampling policy, enforced on each training-tier capture session
    (`SessionSpec.training_sampling`: temperature, truncating knobs at their no-ops)."""
    token_in: bool | None = None
    """Token-in capture for every rollout (`SessionSpec.token_in`; None → on when training)."""
    metadata: dict[str, Any] | None = None
    """Extra session metadata for every rollout (e.g. a trainer's group and episode ids)."""
    public_url: str | None = None
    """The address sandboxes use to reach the proxy (None → the server's own public URL)."""

    @model_validator(mode="before")
    @classmethod
    def _legacy_settings(cls, data: Any) -> Any:
        """Plans written before `settings` (and clients still sending `agent_kwargs` and
        `agent_timeout_s`) keep working: those fields are folded into `settings`."""
        if not isinstance(data, dict) or not ({"agent_kwargs", "agent_timeout_s"} & data.keys()):
            return data
        data = dict(data)
        legacy = RolloutSettings.from_legacy(data.pop("agent_kwargs", None),
                                             data.pop("agent_timeout_s", None))
        settings = data.get("settings")
        if isinstance(settings, RolloutSettings):
            settings = settings.model_dump(exclude_unset=True)
        data["settings"] = {**legacy, **(settings or {})}
        return data

    @model_validator(mode="after")
    def _one_temperature(self) -> RunPlan:
        trainer = (self.training_sampling or {}).get("temperature")
        if trainer is not None and self.settings.temperature is not None \
                and trainer != self.settings.temperature:
            raise ValueError(f"settings.temperature {self.settings.temperature} differs from "
                             f"training_sampling.temperature {trainer}: a rollout samples at one")
        return self

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        return check_public_url(value) if value else None


class RunCounts(BaseModel):
    total: int = 0
    done: int = 0
    ok: int = 0
    failed: int = 0
    running: int = 0


class RunSummary(BaseModel):
    """One row of `GET /admin/runs`."""

    id: str
    state: RunState
    plan: RunPlan
    created_at: float
    finished_at: float | None = None
    counts: RunCounts = Field(default_factory=RunCounts)
    mean_reward: float | None = None
    """Mean over graded rollouts (a null reward is never counted as 0)."""
    pass_rate: float | None = None
    """Share of finished rollouts with reward ≥ 1."""
    failures: dict[str, int] = Field(default_factory=dict)
    """Failed rollouts by error kind."""
    error: str | None = None
    path: str = ""


class PlanError(ValueError):
    """A plan that cannot run (unknown dataset/task/harness/sandbox, bad engine)."""


class RunNotFound(KeyError):
    """No run with that id in this data dir."""


class _Run:
    """A run's in-process state."""

    def __init__(self, run_id: str, path: Path, plan: RunPlan, tasks: list[dict[str, str]],
                 created_at: float) -> None:
        self.id = run_id
        self.path = path
        self.plan = plan
        self.tasks = tasks
        self.created_at = created_at
        self.state: RunState = "interrupted"
        self.finished_at: float | None = None
        self.error: str | None = None
        self.results: dict[str, RolloutResult] = {}
        self.live: dict[str, RolloutResult] = {}
        self.task: asyncio.Task[Any] | None = None

    def rollout_ids(self) -> list[tuple[int, int, str]]:
        return [(g, i, rollout_id(self.id, g, i))
                for g in range(len(self.tasks)) for i in range(self.plan.k)]

    def all_rollouts(self) -> list[RolloutResult]:
        out = []
        for g, i, rid in self.rollout_ids():
            out.append(self.live.get(rid) or self.results.get(rid) or RolloutResult(
                rollout_id=rid, run_id=self.id, task=self.tasks[g]["name"], group=g, index=i))
        return out


def rollout_id(run_id: str, group: int, index: int) -> str:
    """`<run_id>.g<group>r<index>`: unique across runs, sortable within one."""
    return f"{run_id}.g{group:03d}r{index:02d}"


def new_run_id() -> str:
    """`run-YYYYmmdd-HHMMSS-xxxx`."""
    return time.strftime("run-%Y%m%d-%H%M%S-", time.localtime()) + secrets.token_hex(2)


def summarize(run: _Run) -> RunSummary:
    """Counts, mean reward, pass rate and failures by cause for a run."""
    rollouts = run.all_rollouts()
    finished = [r for r in rollouts if r.rollout_id in run.results and r.rollout_id not in run.live]
    graded = [r.reward for r in finished if r.reward is not None]
    failures = Counter(r.error_kind or "not_ok" for r in finished if not r.ok)
    counts = RunCounts(total=len(rollouts), done=len(finished), ok=sum(r.ok for r in finished),
                       failed=sum(not r.ok for r in finished), running=len(run.live))
    return RunSummary(
        id=run.id, state=run.state, plan=run.plan, created_at=run.created_at,
        finished_at=run.finished_at, counts=counts,
        mean_reward=sum(graded) / len(graded) if graded else None,
        pass_rate=sum(1 for r in finished if r.reward is not None and r.reward >= 1.0) / len(finished)
        if finished else None,
        failures=dict(failures), error=run.error, path=str(run.path))


RolloutFn = Callable[..., Awaitable[RolloutResult]]


class BatchRunner:
    """Creates, runs, resumes, cancels and lists runs on one capture service and one event loop."""

    def __init__(self, service: Any, *, data_dir: Path, default_engine: EngineSpec | None,
                 rollout_fn: RolloutFn = run_rollout) -> None:
        self.service = service
        self.data_dir = Path(data_dir)
        self.runs_dir = self.data_dir / "runs"
        self.default_engine = default_engine
        self._rollout_fn = rollout_fn
        self._runs: dict[str, _Run] = {}

    # ----------------------------------------------------------------- plan → run directory

    async def create(self, plan: RunPlan) -> RunSummary:
        """Resolve the plan's tasks and engine, write the run directory; nothing runs yet."""
        tasks = await asyncio.to_thread(resolve_tasks, plan)
        self._engine(plan)  # refuse a bad engine choice before anything is written
        run_id = new_run_id()
        path = self.runs_dir / run_id
        (path / "trials").mkdir(parents=True, exist_ok=False)
        created = time.time()
        _write_json(path / PLAN, {"id": run_id, "created_at": created,
                                  "plan": plan.model_dump(mode="json"), "tasks": tasks})
        run = _Run(run_id, path, plan, tasks, created)
        self._runs[run_id] = run
        self._write_state(run, "running")
        return summarize(run)

    def _engine(self, plan: RunPlan) -> EngineSpec | None:
        from tapdeck.runner.harnesses import get_harness

        try:
            if not get_harness(plan.harness).makes_model_calls:
                return None
        except KeyError as exc:
            raise PlanError(str(exc).strip("'\"")) from exc
        try:
            return resolve_engine(plan.engine, model=plan.engine_model, default=self.default_engine,
                                  tool_parser=plan.engine_tool_parser,
                                  reasoning_parser=plan.engine_reasoning_parser)
        except EngineChoiceError as exc:
            raise PlanError(str(exc)) from exc

    # ----------------------------------------------------------------- execution

    def start(self, run_id: str) -> asyncio.Task[RunSummary]:
        """Run (or resume) a run as a task on the running loop; returns at once."""
        run = self._load(run_id)
        if run.task is not None and not run.task.done():
            raise PlanError(f"run {run_id} is already running")
        run.task = asyncio.get_running_loop().create_task(self.run(run_id), name=f"tapdeck-{run_id}")
        return run.task

    async def run(self, run_id: str) -> RunSummary:
        """Execute every rollout of the run that has not finished yet; returns the final summary."""
        run = self._load(run_id)
        self._write_state(run, "running")
        pending = [(g, i, rid) for g, i, rid in run.rollout_ids()
                   if rid not in run.results or run.results[rid].error_kind in UNFINISHED_KINDS]
        self._publish({"type": "run_started", "run_id": run.id,
                       "run": summarize(run).model_dump(mode="json"), "pending": len(pending)})
        semaphore = asyncio.Semaphore(run.plan.concurrency)
        engine = self._engine(run.plan)

        async def one(group: int, index: int, rid: str) -> None:
            async with semaphore:
                task = run.tasks[group]
                trial_dir = run.path / "trials" / rid
                if trial_dir.exists():
                    # A crashed attempt left a partial trial behind; its result was never recorded.
                    await asyncio.to_thread(shutil.rmtree, trial_dir, True)
                spec = RolloutSpec(
                    task=task["name"], task_path=Path(task["path"]), trials_dir=run.path / "trials",
                    trial_name=rid, harness=run.plan.harness, sandbox=run.plan.sandbox, engine=engine,
                    sandbox_kwargs=run.plan.sandbox_kwargs,
                    timeout_s=run.plan.timeout_s, reward_key=run.plan.reward_key,
                    settings=run.plan.settings, call_budget=run.plan.call_budget,
                    alternatives=run.plan.alternatives, public_url=run.plan.public_url,
                    training_sampling=run.plan.training_sampling, token_in=run.plan.token_in,
                    metadata=dict(run.plan.metadata or {}), rollout_id=rid, run_id=run.id,
                    group=group, index=index)

                def on_update(partial: RolloutResult) -> None:
                    run.live[rid] = partial
                    self._publish({"type": "rollout_updated", "run_id": run.id,
                                   "rollout": partial.model_dump(mode="json")})

                result = await self._rollout_fn(self.service, spec, on_update=on_update)
                self._record(run, result)

        tasks = [asyncio.create_task(one(g, i, rid)) for g, i, rid in pending]
        state: RunState = "finished"
        try:
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            state = "cancelled"
            for t in tasks:
                t.cancel()
            # Let started rollouts record their cancelled results and tear their sandboxes down.
            await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))
        except Exception as exc:  # a bug in the batch machinery itself: say so on the run
            state = "failed"
            run.error = f"{type(exc).__name__}: {exc}"
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            run.live.clear()
            run.finished_at = time.time()
            self._write_state(run, state)
            summary = summarize(run)
            self._publish({"type": "run_finished", "run_id": run.id,
                           "run": summary.model_dump(mode="json")})
        return summary

    def cancel(self, run_id: str) -> RunSummary:
        """Cancel a running run: started rollouts end as `cancelled` (sandboxes torn down)."""
        run = self._load(run_id)
        if run.task is not None and not run.task.done():
            run.task.cancel()
        elif run.state in ("running", "interrupted"):
            self._write_state(run, "cancelled")
        return summarize(run)

    async def wait(self, run_id: str) -> RunSummary:
        """Wait for a started run to end (cancelled or not) and return its summary."""
        run = self._load(run_id)
        if run.task is not None:
            await asyncio.gather(run.task, return_exceptions=True)
        return summarize(run)

    def _record(self, run: _Run, result: RolloutResult) -> None:
        line = result.model_dump_json() + "\n"
        path = run.path / RESULTS
        if path.is_file() and path.stat().st_size:
            with open(path, "rb") as fh:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    line = "\n" + line  # a crash tore the last line: start on a fresh one
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        run.results[result.rollout_id] = result
        run.live.pop(result.rollout_id, None)
        self._publish({"type": "rollout_updated", "run_id": run.id,
                       "rollout": result.model_dump(mode="json"),
                       "run": summarize(run).model_dump(mode="json")})

    def _publish(self, event: dict[str, Any]) -> None:
        events = getattr(self.service, "events", None)
        if events is not None:
            events.publish(event)

    # ----------------------------------------------------------------- queries

    def list(self) -> list[RunSummary]:
        """Every run in the data dir, newest first."""
        if self.runs_dir.is_dir():
            for path in self.runs_dir.iterdir():
                if path.name not in self._runs and (path / PLAN).is_file():
                    try:
                        self._load(path.name)
                    except (OSError, ValueError):
                        continue
        return sorted((summarize(r) for r in self._runs.values()), key=lambda s: s.created_at,
                      reverse=True)

    def get(self, run_id: str) -> tuple[RunSummary, list[RolloutResult]]:
        """A run's summary and every rollout (finished, live, or still queued)."""
        run = self._load(run_id)
        return summarize(run), run.all_rollouts()

    def results(self, run_id: str) -> list[RolloutResult]:
        """The finished rollouts of a run, in plan order."""
        run = self._load(run_id)
        return [run.results[rid] for _, _, rid in run.rollout_ids() if rid in run.results]

    def _load(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is not None:
            return run
        path = self.runs_dir / run_id
        if "/" in run_id or run_id.startswith(".") or not (path / PLAN).is_file():
            raise RunNotFound(run_id)
        doc = json.loads((path / PLAN).read_text())
        run = _Run(run_id, path, RunPlan.model_validate(doc["plan"]), doc["tasks"], doc["created_at"])
        run.results = load_results(path / RESULTS)
        state_doc = _read_json(path / STATE) or {}
        state = state_doc.get("state", "running")
        # Not running in this process but recorded as running: its process died.
        run.state = "interrupted" if state == "running" else state
        run.finished_at = state_doc.get("finished_at")
        run.error = state_doc.get("error")
        self._runs[run_id] = run
        return run

    def _write_state(self, run: _Run, state: RunState) -> None:
        run.state = state
        _write_json(run.path / STATE, {"state": state, "created_at": run.created_at,
                                       "finished_at": run.finished_at, "error": run.error})

    # ----------------------------------------------------------------- export

    def export(self, run_id: str, fmt: Literal["jsonl", "parquet"] = "jsonl") -> dict[str, Any]:
        """Write the run's training rows (one per trainable rollout, with group id and reward)."""
        from tapdeck.proxy.export import write_jsonl, write_parquet

        run = self._load(run_id)
        rows: list[dict[str, Any]] = []
        skipped: dict[str, str] = {}
        for result in self.results(run_id):
            if result.session_id is None:
                skipped[result.rollout_id] = "no capture session"
                continue
            try:
                trace = self.service.training_trace(result.session_id)
            except Exception as exc:  # eval tier (409) or a session this server no longer has
                skipped[result.rollout_id] = str(exc)
                continue
            rows.append({"run_id": run.id, "rollout_id": result.rollout_id, "task": result.task,
                         "group": result.group, "index": result.index, "reward": result.reward,
                         "ok": result.ok, "session_id": result.session_id, **trace})
        path = run.path / f"export.{fmt}"
        (write_parquet if fmt == "parquet" else write_jsonl)(path, rows)
        return {"path": str(path), "rows": len(rows), "skipped": skipped}


def load_results(path: Path) -> dict[str, RolloutResult]:
    """Finished rollouts by id (last line wins); a torn last line from a crash is ignored."""
    out: dict[str, RolloutResult] = {}
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            result = RolloutResult.model_validate_json(line)
        except ValueError:
            continue
        out[result.rollout_id] = result
    return out


def resolve_tasks(plan: RunPlan) -> list[dict[str, str]]:
    """The plan's tasks as `[{name, path}]` (one GRPO group each), via the dataset loader."""
    from tapdeck.runner.datasets import resolve_dataset

    try:
        dataset = resolve_dataset(plan.dataset)
    except Exception as exc:
        raise PlanError(f"cannot load dataset {plan.dataset or '(sample)'}: {exc}") from exc
    tasks = [{"name": t.name, "path": str(t.path)} for t in dataset.tasks]
    if plan.tasks:
        by_name = {t["name"]: t for t in tasks}
        missing = [n for n in plan.tasks if n not in by_name]
        if missing:
            raise PlanError(f"unknown task(s) {', '.join(missing)}; the dataset has "
                            f"{', '.join(sorted(by_name)) or 'no tasks'}")
        tasks = [by_name[n] for n in plan.tasks]
    if plan.n_tasks is not None:
        tasks = tasks[: plan.n_tasks]
    if not tasks:
        raise PlanError(f"dataset {plan.dataset or '(sample)'} has no tasks")
    return tasks


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
