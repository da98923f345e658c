"""The runner's admin routes, mounted into the server app through `create_app(routers=...,
exception_handlers=EXCEPTION_HANDLERS)`: routes raise the runner's errors (`runner/errors.py`, each
with its status) and one handler answers them.

`GET /admin/catalog`, `POST/GET /admin/runs`, `GET /admin/runs/{id}`, `POST /admin/runs/{id}/cancel`,
`POST /admin/runs/{id}/rollouts/{rollout_id}/cancel` (one rollout), `POST /admin/runs/{id}/resume`, `POST
/admin/runs/{id}/export`. Inside a running rollout's sandbox (runner/sandboxes/live_sandboxes.py):
`POST .../rollouts/{rollout_id}/exec` (body `{command, timeout_s}`), `GET .../processes`,
`GET .../agent-output?tail_bytes=`. Runs execute as asyncio tasks on the runner's own loop and thread
(`runner_loop.RunnerLoop`: the server's loop is uvloop, on which Harbor trials hang); when the server shuts
down, running runs are cancelled (sandboxes torn down) and can be resumed later.

Training: `GET /admin/train/recipes`, `POST/GET /admin/train`, `POST /admin/train/plan` (a dry
run: what a launch would start, and on which GPUs), `GET /admin/train/{id}`,
`GET /admin/train/{id}/log?offset=&tail=`, `GET /admin/train/{id}/metrics?after=`,
`GET /admin/train/{id}/events` (SSE: log, metrics, state; ends with the run),
`POST /admin/train/{id}/stop`. Recipes run as subprocesses on the server's machine and are stopped
when the server shuts down.

Replays (runner/replay): `POST /admin/sessions/{id}/replay` (body `{engine, model, api_key}`;
`engine: "embedded"` is this server's default engine when it is the embedded one),
`GET /admin/sessions/{id}/replays`, `GET /admin/sessions/{id}/replays/{replay_id}/logprobs` (both
engines' logprobs per token), `DELETE /admin/sessions/{id}/replays/{replay_id}`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tapdeck.proxy.errors import ProxyError
from tapdeck.proxy.http.error_reply import error_response
from tapdeck.proxy.http.server import require_admin
from tapdeck.proxy.upstream.default_engine import DefaultEngine
from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.runner.batch import BatchRunner
from tapdeck.runner.errors import ReplayRefused, RunnerError, RunUnreadable
from tapdeck.runner.runner_loop import RunnerLoop
from tapdeck.runner.sandboxes.abandoned_containers import remove_abandoned
from tapdeck.runner.sandboxes.live_sandboxes import (
    OUTPUT_LIMIT_BYTES,
    agent_output,
    processes,
    run_in,
)
from tapdeck.runner.service_protocol import CaptureServiceProtocol
from tapdeck.runner.train_jobs import TrainingJobs, run_rows_for_training
from tapdeck.schema.catalog import Catalog, EngineInfo
from tapdeck.schema.replay import ReplayList, ReplayLogprobs, ReplayRequest, ReplayResult
from tapdeck.schema.runs import (
    ExportRequest,
    ExportResult,
    RolloutResult,
    RunDetail,
    RunList,
    RunPlan,
    RunSummary,
)
from tapdeck.schema.sandbox import AgentOutput, ExecReply, ExecRequest, ProcessList
from tapdeck.schema.tls import CA_FILE_ENV
from tapdeck.schema.train import (
    RecipeList,
    TrainLog,
    TrainMetrics,
    TrainPlan,
    TrainRequest,
    TrainRunInfo,
    TrainRunList,
)

SHUTDOWN_GRACE_S = 60.0


async def _runner_error(request: Request, exc: RunnerError) -> Response:
    """A runner refusal in the shape every admin error has (`proxy/http/error_reply.py`)."""
    return error_response(request.url.path, ProxyError(exc.status, exc.message))


EXCEPTION_HANDLERS: dict[type[Exception], Callable[..., Any]] = {RunnerError: _runner_error}
"""What an app that mounts the runner's routes registers with them
(`create_app(routers=..., exception_handlers=EXCEPTION_HANDLERS)`): the routes raise the runner's
errors (`runner/errors.py`) and leave their rendering to it."""


def create_runner_router(
    service: CaptureServiceProtocol,
    *,
    data_dir: Path,
    default_engine: DefaultEngine | EngineSpec | None,
    admin_key: str | None = None,
    default_is_embedded: bool = False,
    ca_file: Path | None = None,
) -> APIRouter:
    """The runner routes for one capture service; the BatchRunner is exposed as `router.batch`,
    the training runs as `router.training`. `default_is_embedded`: the default engine is the
    embedded one (runs on it say "embedded", not its loopback URL).

    Recipes reach this server at its public URL with `admin_key` (passed in their environment),
    trusting `ca_file` (the server's own certificate, when it serves HTTPS). `default_engine` is
    the one the capture service holds: a server still waiting for it answers runs on it with a 503.
    """
    default_engine = DefaultEngine.of(default_engine)
    runner_loop = RunnerLoop()
    batch = BatchRunner(
        service,
        data_dir=Path(data_dir),
        default_engine=default_engine,
        loop=runner_loop,
        default_is_embedded=default_is_embedded,
    )
    server_env = {"TAPDECK_SERVER_URL": service.public_url}
    if admin_key:
        server_env["TAPDECK_ADMIN_KEY"] = admin_key
    if ca_file is not None:
        server_env[CA_FILE_ENV] = str(ca_file)
    training = TrainingJobs(
        Path(data_dir), server_env=server_env, export_run=lambda run_id: run_rows_for_training(batch, run_id)
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        # Docker sandboxes a killed server left running go now (on a thread: start is not held).
        sweep = asyncio.create_task(asyncio.to_thread(remove_abandoned))
        yield
        await sweep
        await asyncio.to_thread(training.stop_all)
        running = batch.running_here()  # not another process's runs on the same data dir
        for run_id in running:
            batch.cancel(run_id)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SHUTDOWN_GRACE_S):
                for run_id in running:
                    await batch.wait(run_id)
        await asyncio.to_thread(runner_loop.stop)

    router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)], lifespan=lifespan)
    router.batch = batch  # type: ignore[attr-defined]
    router.training = training  # type: ignore[attr-defined]

    def _run(run_id: str, doing: str = "read") -> tuple[RunSummary, list[RolloutResult]]:
        """The run's summary and rollouts, read before a route acts on it: RunNotFound for no such
        run; for one whose plan.json cannot be read, RunUnreadable saying which file and why after
        `cannot <doing> run <id>:` (the batch's own message is the bare why, which the CLI words
        its own way)."""
        try:
            return batch.get(run_id)
        except RunUnreadable as exc:
            raise RunUnreadable(f"cannot {doing} run {run_id}: {exc}") from exc

    @router.get("/catalog", response_model=Catalog)
    async def catalog() -> JSONResponse:
        from tapdeck.runner.catalog import build_catalog, url_engine_info

        doc = (await asyncio.to_thread(build_catalog, probe=False)).model_dump(mode="json")
        engine, wait = default_engine.spec, default_engine.waiting()
        row: dict[str, Any] | None = None
        if wait is not None:
            waiting = EngineInfo(name="embedded", url=None, tier=None, reachable=False, why=wait.line())
            row = waiting.model_dump()
        elif engine is not None:
            # "embedded" in a plan means this server's default engine: report that one, probed on
            # this loop as its sessions are (same model, so the probe cache answers for both).
            info = await url_engine_info(engine.url, api_key=engine.api_key, model=engine.model)
            row = {**info.model_dump(mode="json"), "name": "embedded"}
        if row is not None:
            row["why"] = f"this server's default engine; {row['why']}"
            doc["engines"] = [row, *(e for e in doc["engines"] if e["name"] != "embedded")]
        return JSONResponse(doc)

    @router.post("/runs", response_model=RunSummary)
    async def start_run(plan: RunPlan) -> JSONResponse:
        summary = await batch.create(plan)
        batch.start(summary.id)
        return JSONResponse(batch.get(summary.id)[0].model_dump(mode="json"))

    @router.get("/runs", response_model=RunList)
    async def list_runs() -> JSONResponse:
        runs = await asyncio.to_thread(batch.list)
        return JSONResponse({"runs": [r.model_dump(mode="json") for r in runs]})

    @router.get("/runs/{run_id}", response_model=RunDetail)
    async def get_run(run_id: str) -> JSONResponse:
        summary, rollouts = _run(run_id)
        return JSONResponse(
            {**summary.model_dump(mode="json"), "rollouts": [r.model_dump(mode="json") for r in rollouts]}
        )

    @router.post("/runs/{run_id}/cancel", response_model=RunSummary)
    async def cancel_run(run_id: str) -> JSONResponse:
        _run(run_id, "cancel")
        summary = batch.cancel(run_id)
        return JSONResponse(summary.model_dump(mode="json"))

    @router.post("/runs/{run_id}/rollouts/{rollout_id}/cancel", response_model=RolloutResult)
    async def cancel_rollout(run_id: str, rollout_id: str) -> JSONResponse:
        _run(run_id, "cancel a rollout of")
        rollout = batch.cancel_rollout(run_id, rollout_id)
        return JSONResponse(rollout.model_dump(mode="json"))

    @router.post("/runs/{run_id}/rollouts/{rollout_id}/exec", response_model=ExecReply)
    async def exec_in_rollout(run_id: str, rollout_id: str, body: ExecRequest) -> JSONResponse:
        _run(run_id, "reach a rollout of")
        sandbox = batch.live_sandbox(run_id, rollout_id)
        reply = await run_in(sandbox, body.command, body.timeout_s)
        return JSONResponse(reply.model_dump(mode="json"))

    @router.get("/runs/{run_id}/rollouts/{rollout_id}/processes", response_model=ProcessList)
    async def rollout_processes(run_id: str, rollout_id: str) -> JSONResponse:
        _run(run_id, "reach a rollout of")
        found = await processes(batch.live_sandbox(run_id, rollout_id))
        return JSONResponse(ProcessList(rollout_id=rollout_id, processes=found).model_dump(mode="json"))

    @router.get("/runs/{run_id}/rollouts/{rollout_id}/agent-output", response_model=AgentOutput)
    async def rollout_agent_output(run_id: str, rollout_id: str, tail_bytes: int = 16384) -> JSONResponse:
        _run(run_id, "reach a rollout of")
        sandbox = batch.live_sandbox(run_id, rollout_id)
        path, size, text = await agent_output(sandbox, max(1, min(tail_bytes, OUTPUT_LIMIT_BYTES)))
        doc = AgentOutput(rollout_id=rollout_id, file=path, size=size, text=text)
        return JSONResponse(doc.model_dump(mode="json"))

    @router.post("/runs/{run_id}/resume", response_model=RunSummary)
    async def resume_run(run_id: str) -> JSONResponse:
        _run(run_id, "resume")
        batch.start(run_id)
        return JSONResponse(batch.get(run_id)[0].model_dump(mode="json"))

    @router.post("/runs/{run_id}/export", response_model=ExportResult)
    async def export_run(run_id: str, body: ExportRequest | None = None) -> JSONResponse:
        _run(run_id, "export")
        fmt = body.format if body is not None else "jsonl"
        return JSONResponse(await asyncio.to_thread(batch.export, run_id, fmt))

    def _replay(session_id: str, body: ReplayRequest) -> ReplayResult:
        from tapdeck.runner.replay.reference import ReferenceEngine
        from tapdeck.runner.replay.session import replay_session

        service.get(session_id)  # an unknown session is a 404, as on the other session routes
        if body.engine.strip().lower() == "embedded":
            spec = default_engine.spec
            if spec is None or not default_is_embedded:
                raise ReplayRefused(
                    "this server runs no embedded engine: give the reference engine's address as `engine`"
                )
            reference = ReferenceEngine.at(
                spec.url, model=body.model or spec.model, api_key=spec.api_key, name="embedded"
            )
        else:
            reference = ReferenceEngine.at(body.engine, model=body.model, api_key=body.api_key)
        try:
            return replay_session(service.store, session_id, reference)[0]
        finally:
            reference.close()

    @router.post("/sessions/{session_id}/replay", response_model=ReplayResult)
    async def replay(session_id: str, body: ReplayRequest | None = None) -> JSONResponse:
        result = await asyncio.to_thread(_replay, session_id, body or ReplayRequest())
        return JSONResponse(result.model_dump(mode="json"))

    @router.get("/sessions/{session_id}/replays", response_model=ReplayList)
    async def list_replays(session_id: str) -> JSONResponse:
        await asyncio.to_thread(service.get, session_id)
        docs = await asyncio.to_thread(service.store.list_replays, session_id)
        return JSONResponse({"replays": docs})

    @router.get("/sessions/{session_id}/replays/{replay_id}/logprobs", response_model=ReplayLogprobs)
    async def get_replay_logprobs(session_id: str, replay_id: str) -> JSONResponse:
        from tapdeck.runner.replay.session import replay_logprobs

        await asyncio.to_thread(service.get, session_id)
        if not any(doc["id"] == replay_id for doc in service.store.list_replays(session_id)):
            raise ProxyError(404, f"session {session_id} has no replay {replay_id}")
        body = await asyncio.to_thread(replay_logprobs, service.store, session_id, replay_id)
        return JSONResponse(body.model_dump(mode="json"))

    @router.delete("/sessions/{session_id}/replays/{replay_id}", response_model=ReplayList)
    async def delete_replay(session_id: str, replay_id: str) -> JSONResponse:
        await asyncio.to_thread(service.get, session_id)
        if not any(doc["id"] == replay_id for doc in service.store.list_replays(session_id)):
            raise ProxyError(404, f"session {session_id} has no replay {replay_id}")
        await asyncio.to_thread(service.store.delete_replay, replay_id)
        docs = await asyncio.to_thread(service.store.list_replays, session_id)
        return JSONResponse({"replays": docs})

    @router.get("/train/recipes", response_model=RecipeList)
    async def train_recipes() -> JSONResponse:
        infos = await asyncio.to_thread(training.recipes)
        return JSONResponse({"recipes": [r.model_dump() for r in infos]})

    @router.post("/train", response_model=TrainRunInfo)
    async def start_training(request: TrainRequest) -> JSONResponse:
        info = await asyncio.to_thread(training.launch, request)
        return JSONResponse(info.model_dump())

    @router.post("/train/plan", response_model=TrainPlan)
    async def plan_training(request: TrainRequest) -> JSONResponse:
        plan = await asyncio.to_thread(training.plan, request)
        return JSONResponse(plan.model_dump())

    @router.get("/train", response_model=TrainRunList)
    async def list_training() -> JSONResponse:
        runs = await asyncio.to_thread(training.list)
        return JSONResponse({"runs": [r.model_dump() for r in runs]})

    @router.get("/train/{run_id}", response_model=TrainRunInfo)
    async def get_training(run_id: str) -> JSONResponse:
        return JSONResponse(training.get(run_id).model_dump())

    @router.get("/train/{run_id}/log", response_model=TrainLog)
    async def training_log(run_id: str, offset: int | None = None, tail: int = 200) -> JSONResponse:
        log = await asyncio.to_thread(training.log, run_id, offset=offset, tail=max(0, min(tail, 5000)))
        return JSONResponse(log.model_dump())

    @router.get("/train/{run_id}/metrics", response_model=TrainMetrics)
    async def training_metrics(run_id: str, after: int = 0) -> JSONResponse:
        metrics = await asyncio.to_thread(training.metrics, run_id, after)
        return JSONResponse(metrics.model_dump())

    @router.get("/train/{run_id}/events")
    async def training_events(run_id: str) -> StreamingResponse:
        training.record(run_id)  # TrainNotFound before the stream starts

        async def stream() -> AsyncIterator[bytes]:
            async for event in training.follow(run_id):
                yield b"data: " + event.model_dump_json().encode() + b"\n\n"

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    @router.post("/train/{run_id}/stop", response_model=TrainRunInfo)
    async def stop_training(run_id: str) -> JSONResponse:
        info = await asyncio.to_thread(training.stop, run_id)
        return JSONResponse(info.model_dump())

    return router
