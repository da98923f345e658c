"""The runner's admin routes, mounted into the server app through `create_app(routers=...)`.

`GET /admin/catalog`, `POST/GET /admin/runs`, `GET /admin/runs/{id}`, `POST /admin/runs/{id}/cancel`,
`POST /admin/runs/{id}/resume`, `POST /admin/runs/{id}/export`. Runs execute on the server's own
event loop as asyncio tasks; when the server shuts down, running runs are cancelled (sandboxes torn
down) and can be resumed later.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from tapdeck.proxy.server import require_admin
from tapdeck.proxy.tiers import EngineSpec
from tapdeck.runner.batch import BatchRunner, PlanError, RunNotFound, RunPlan

SHUTDOWN_GRACE_S = 60.0


class ExportRequest(BaseModel):
    """`POST /admin/runs/{id}/export` body."""

    format: Literal["jsonl", "parquet"] = "jsonl"


def create_runner_router(service: Any, *, data_dir: Path,
                         default_engine: EngineSpec | None) -> APIRouter:
    """The runner routes for one capture service; the BatchRunner is exposed as `router.batch`."""
    batch = BatchRunner(service, data_dir=Path(data_dir), default_engine=default_engine)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        yield
        running = [r for r in batch.list() if r.state == "running"]
        for summary in running:
            batch.cancel(summary.id)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SHUTDOWN_GRACE_S):
                for summary in running:
                    await batch.wait(summary.id)

    router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)], lifespan=lifespan)
    router.batch = batch  # type: ignore[attr-defined]

    def _run_or_404(run_id: str) -> Any:
        try:
            return batch.get(run_id)
        except RunNotFound as exc:
            raise HTTPException(404, f"no run {run_id}") from exc

    @router.get("/catalog")
    async def catalog() -> JSONResponse:
        from tapdeck.runner.catalog import build_catalog, url_engine_info

        doc = (await asyncio.to_thread(build_catalog, probe=False)).model_dump(mode="json")
        if default_engine is not None:
            # "embedded" in a plan means this server's default engine: report that one, probed on
            # this loop (the probe cache is shared with the capture service).
            info = await url_engine_info(default_engine.url, api_key=default_engine.api_key)
            row = info.model_dump(mode="json")
            row["name"] = "embedded"
            row["why"] = f"this server's default engine; {row['why']}"
            doc["engines"] = [row, *(e for e in doc["engines"] if e["name"] != "embedded")]
        return JSONResponse(doc)

    @router.post("/runs")
    async def start_run(plan: RunPlan) -> JSONResponse:
        try:
            summary = await batch.create(plan)
            batch.start(summary.id)
        except PlanError as exc:
            raise HTTPException(400, str(exc)) from exc
        return JSONResponse(batch.get(summary.id)[0].model_dump(mode="json"))

    @router.get("/runs")
    async def list_runs() -> JSONResponse:
        runs = await asyncio.to_thread(batch.list)
        return JSONResponse({"runs": [r.model_dump(mode="json") for r in runs]})

    @router.get("/runs/{run_id}")
    async def get_run(run_id: str) -> JSONResponse:
        summary, rollouts = _run_or_404(run_id)
        return JSONResponse({**summary.model_dump(mode="json"),
                             "rollouts": [r.model_dump(mode="json") for r in rollouts]})

    @router.post("/runs/{run_id}/cancel")
    async def cancel_run(run_id: str) -> JSONResponse:
        _run_or_404(run_id)
        return JSONResponse(batch.cancel(run_id).model_dump(mode="json"))

    @router.post("/runs/{run_id}/resume")
    async def resume_run(run_id: str) -> JSONResponse:
        _run_or_404(run_id)
        try:
            batch.start(run_id)
        except PlanError as exc:
            raise HTTPException(409, str(exc)) from exc
        return JSONResponse(batch.get(run_id)[0].model_dump(mode="json"))

    @router.post("/runs/{run_id}/export")
    async def export_run(run_id: str, body: ExportRequest | None = None) -> JSONResponse:
        _run_or_404(run_id)
        fmt = body.format if body is not None else "jsonl"
        return JSONResponse(await asyncio.to_thread(batch.export, run_id, fmt))

    return router
