"""Training runs on the wire: `/admin/train` requests, runs, logs, metrics and their SSE events."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class TrainRequest(BaseModel):
    """`POST /admin/train` body."""

    recipe: str
    run: str | None = None
    """A rollout run on this server whose exported rows the recipe reads (data-check)."""
    args: list[str] = Field(default_factory=list)
    """Passed to the recipe unchanged, after the ones the server adds."""


class RecipeInfo(BaseModel):
    """One row of `GET /admin/train/recipes`: a recipe and whether this server's machine can start it."""

    name: str
    summary: str
    where: str
    updates_weights: bool
    takes_run: bool
    env: str
    available: bool
    why: str


class TrainRunInfo(BaseModel):
    """One training run, as `GET /admin/train[/{id}]` reports it."""

    id: str
    recipe: str
    state: str
    exit_code: int | None = None
    error: str | None = None
    started_at: float
    finished_at: float | None = None
    pid: int | None = None
    argv: list[str] = Field(default_factory=list)
    run_dir: str


class TrainLog(BaseModel):
    """`GET /admin/train/{id}/log`: lines of the run's log and the byte offset to ask from next."""

    lines: list[str]
    offset: int


class MetricRow(BaseModel):
    """One scalar a run logged to trackio."""

    step: int
    name: str
    value: float


class TrainMetrics(BaseModel):
    """`GET /admin/train/{id}/metrics`: points after a cursor and the cursor to ask from next."""

    points: list[MetricRow]
    cursor: int


class RecipeList(BaseModel):
    """`GET /admin/train/recipes`."""

    recipes: list[RecipeInfo]


class TrainRunList(BaseModel):
    """`GET /admin/train`: the server's training runs, newest first."""

    runs: list[TrainRunInfo]


class TrainLogEvent(BaseModel):
    """`GET /admin/train/{id}/events`: new log lines."""

    type: Literal["log"] = "log"
    lines: list[str]


class TrainMetricsEvent(BaseModel):
    """`GET /admin/train/{id}/events`: new trackio points."""

    type: Literal["metrics"] = "metrics"
    points: list[MetricRow]


class TrainStateEvent(BaseModel):
    """`GET /admin/train/{id}/events`: the run's state changed (the last event when it ends)."""

    type: Literal["state"] = "state"
    run: TrainRunInfo


TrainEvent = TrainLogEvent | TrainMetricsEvent | TrainStateEvent
_TRAIN_EVENTS: dict[str, type[TrainEvent]] = {
    m.model_fields["type"].default: m for m in (TrainLogEvent, TrainMetricsEvent, TrainStateEvent)}


def parse_train_event(data: object) -> TrainEvent | None:
    """One training event from its JSON; None for a type this schema does not know."""
    model = _TRAIN_EVENTS.get(data.get("type")) if isinstance(data, dict) else None
    return None if model is None else model.model_validate(data)
