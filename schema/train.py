"""Training runs on the wire: `/admin/train` requests, runs, logs, metrics and their SSE events."""

from __future__ import annotations

from collections.abc import Sequence
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
    rows_options: list[str] = Field(default_factory=list)
    """Its own options that name the rows it reads instead of a run (`--rows PATH`)."""
    run_option: bool = False
    """It reads a rollout run itself (its own `--run RUN`): a launch's run is passed to it."""
    env: str
    available: bool
    why: str

    def rows_missing(self, run: str | None, args: Sequence[str]) -> str | None:
        """Why a launch with `run` and these recipe args would fail at once (see `rows_missing`)."""
        return rows_missing(self.name, self.takes_run, self.rows_options, run, args)

    @property
    def uses_run(self) -> bool:
        """A launch's rollout run means something to it (its rows, or the run it reads itself)."""
        return self.takes_run or self.run_option


def rows_missing(
    name: str, takes_run: bool, rows_options: Sequence[str], run: str | None, args: Sequence[str]
) -> str | None:
    """Why a recipe that reads a run's rows is certain to fail at its argument parser when
    launched with `run` and these args (the rows named nowhere), or None.

    One rule for the CLI (which knows the recipes) and the TUI (which gets them from the server)."""
    if not takes_run or not rows_options or run:
        return None
    # Its own `--run` (after `--`) reads its data dir's export; `--help` ends before the check.
    given = {"--run", "-h", "--help", *(option.split()[0] for option in rows_options)}
    if any(arg.split("=", 1)[0] in given for arg in args):
        return None
    return f"{name} needs --run RUN (or {' or '.join(rows_options)})"


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


class LaunchCommand(BaseModel):
    """One process of a launch, as `POST /admin/train/plan` shows it."""

    role: Literal["vllm", "trainer"]
    """vLLM's server (the operator starts it) or the recipe's process (the server starts it)."""
    started_by: Literal["operator", "server"]
    env: dict[str, str] = Field(default_factory=dict)
    """Variables set on top of the environment it inherits (secrets left out)."""
    argv: list[str]
    gpus: list[str] = Field(default_factory=list)
    """The GPUs it gets (its `CUDA_VISIBLE_DEVICES`); empty: none set."""


class TrainPlan(BaseModel):
    """`POST /admin/train/plan`: what a launch of the request would run, started by nobody."""

    recipe: str
    commands: list[LaunchCommand]
    notes: list[str] = Field(default_factory=list)
    """What the commands cannot say (the run id is new at each launch, rows exported at launch)."""


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
    m.model_fields["type"].default: m for m in (TrainLogEvent, TrainMetricsEvent, TrainStateEvent)
}


def parse_train_event(data: object) -> TrainEvent | None:
    """One training event from its JSON; None for a type this schema does not know."""
    kind = data.get("type") if isinstance(data, dict) else None
    model = _TRAIN_EVENTS.get(kind) if isinstance(kind, str) else None
    return None if model is None else model.model_validate(data)
