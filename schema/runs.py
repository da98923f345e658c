"""Batches on the wire: the run plan a client posts, and runs and rollouts as the server reports them."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from tapdeck.schema.addresses import check_public_url
from tapdeck.schema.findings import Finding
from tapdeck.schema.settings import ResolvedSettings, RolloutSettings

RunState = Literal["running", "finished", "cancelled", "failed", "interrupted"]
Phase = Literal["queued", "install", "sandbox", "agent_setup", "agent", "verify", "done", "failed"]
ENDED_PHASES: frozenset[Phase] = frozenset({"done", "failed"})
"""The phases a rollout ends in."""
PASS_REWARD = 1.0
"""A rollout passes when its verifier gave the full reward (Harbor's tests all passed)."""
RERUN_ON_RESUME = frozenset({"cancelled", "engine_unreachable"})
"""Rollout error kinds that run again when their run is resumed (with the rollouts never run): the
rollout was stopped, or its engine went away, so it has no outcome of its own to keep."""


def graded_rewards(rewards: Iterable[float | None]) -> list[float]:
    """The rewards that were given (None = never graded: left out, never read as 0)."""
    return [float(r) for r in rewards if r is not None and math.isfinite(r)]


def mean_reward(rewards: Iterable[float | None]) -> float | None:
    """Mean over graded rollouts; None when none was graded."""
    graded = graded_rewards(rewards)
    return sum(graded) / len(graded) if graded else None


def pass_rate(rewards: Iterable[float | None]) -> float | None:
    """Share of graded rollouts with the full reward (≥ PASS_REWARD); None when none was graded.

    What a trainer means by it: how often the policy solved the task when it was judged. A partial
    reward (> 0, < 1) is not a pass, and a rollout that never reached its verifier (sandbox or
    engine failure, reward None) says nothing about the policy: it is counted under failures."""
    graded = graded_rewards(rewards)
    return sum(1 for r in graded if r >= PASS_REWARD) / len(graded) if graded else None


class RolloutResult(BaseModel):
    """What one rollout produced (also one line of a run's results.jsonl)."""

    rollout_id: str
    run_id: str | None = None
    task: str
    group: int = 0
    """GRPO group: the task's index in the run's plan (all K rollouts of a task share it)."""
    index: int = 0
    session_id: str | None = None
    ok: bool = False
    reward: float | None = None
    """None = never graded (or the reward rule refused): never read as 0."""
    rewards: dict[str, float] = Field(default_factory=dict)
    reward_key: str | None = None
    tier: str | None = None
    rollout_type: str | None = None
    turns: int = 0
    findings: list[Finding] = Field(default_factory=list)
    atif: Literal["match", "mismatch", "none"] = "none"
    timings: dict[str, float] = Field(default_factory=dict)
    error_kind: str | None = None
    error: str | None = None
    phase: Phase = "queued"
    detail: str | None = None
    """The running phase's latest progress line (an agent CLI's install on first use)."""
    harness: str | None = None
    sandbox: str | None = None
    trial_dir: str | None = None
    settings: ResolvedSettings | None = None
    """What the agent ran with, each value with its source (plan, task, engine, default)."""
    started_at: float | None = None
    finished_at: float | None = None
    phase_started: dict[str, float] = Field(default_factory=dict)
    """When each phase began (wall clock): live per-phase timings while the rollout runs."""


def runs_again_on_resume(rollout: RolloutResult) -> bool:
    """Whether resuming its (stopped) run runs this rollout again: never finished, cancelled, or
    ended by an engine that did not answer."""
    return rollout.finished_at is None or rollout.error_kind in RERUN_ON_RESUME


class RolloutTemplate(BaseModel):
    """How each rollout of a plan runs: harness, sandbox, engine, limits, agent settings, capture.

    One spec: a run plan nests it (`plan.rollout`), the runner runs each rollout from it, and the
    CLI, Setup and the TRL recipe build it."""

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
    timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
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
    min_loss_mask_fraction: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False)
    """A rollout with a smaller share of its agent's sampled tokens in the loss is graded
    `degenerate` and skipped by trainers (`SessionSpec.min_loss_mask_fraction`; None → the
    default, `schema.rollout_health.DEFAULT_MIN_LOSS_MASK_FRACTION`)."""
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
        if not isinstance(data, dict) or not (LEGACY_SETTINGS & data.keys()):
            return data
        data = dict(data)
        legacy = RolloutSettings.from_legacy(
            data.pop("agent_kwargs", None), data.pop("agent_timeout_s", None)
        )
        settings = data.get("settings")
        if isinstance(settings, RolloutSettings):
            settings = settings.model_dump(exclude_unset=True)
        data["settings"] = {**legacy, **(settings or {})}
        return data

    @model_validator(mode="after")
    def _one_temperature(self) -> RolloutTemplate:
        trainer = (self.training_sampling or {}).get("temperature")
        if (
            trainer is not None
            and self.settings.temperature is not None
            and trainer != self.settings.temperature
        ):
            raise ValueError(
                f"settings.temperature {self.settings.temperature} differs from "
                f"training_sampling.temperature {trainer}: a rollout samples at one"
            )
        return self

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        return check_public_url(value) if value else None


LEGACY_SETTINGS = frozenset({"agent_kwargs", "agent_timeout_s"})
"""Fields older plans had where `settings` is now."""


# Bounds on a plan's size: the server builds a record per rollout up front and a plan is easy to
# mistype (`-k 1000000000000` hung the server, eating GBs): sizes far past any real batch are
# refused. The total (tasks × k) is checked where the tasks are known (`resolve_tasks`).
MAX_K = 1024
"""Rollouts per task: far past a GRPO group's size (8-64)."""
MAX_CONCURRENCY = 1024
"""Rollouts at once: each is a sandbox and an agent process."""
MAX_TASKS = 100_000
"""Tasks of a plan (`n_tasks`)."""
MAX_ROLLOUTS = 100_000
"""Rollouts of a plan (tasks × k)."""


class RunPlan(BaseModel):
    """`POST /admin/runs` body: which tasks, how many rollouts of each, and how each one runs.
    Defaults run offline on the sample dataset.

    A plan in the older flat shape (the rollout's fields beside `dataset`: plans stored by earlier
    servers, which resume reads back, and clients not yet sending `rollout`) is read as the same
    plan: those fields move into `rollout`."""

    dataset: str | None = None
    """A local folder, a registry name, ...; None → tapdeck's sample dataset."""
    tasks: list[str] | None = None
    """Task names to keep (None → all, or the first `n_tasks`)."""
    n_tasks: int | None = Field(default=None, ge=1, le=MAX_TASKS)
    k: int = Field(default=1, ge=1, le=MAX_K)
    """Rollouts per task (the GRPO group size)."""
    concurrency: int = Field(default=1, ge=1, le=MAX_CONCURRENCY)
    rollout: RolloutTemplate = Field(default_factory=RolloutTemplate)
    """How each rollout runs."""

    @model_validator(mode="before")
    @classmethod
    def _flat_plan(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        flat = {
            key: data[key] for key in data if key in RolloutTemplate.model_fields or key in LEGACY_SETTINGS
        }
        if not flat:
            return data
        nested = data.get("rollout")
        if isinstance(nested, RolloutTemplate):
            nested = nested.model_dump(exclude_unset=True)
        rest = {key: value for key, value in data.items() if key not in flat}
        return {**rest, "rollout": {**flat, **(nested or {})}}


class RunCounts(BaseModel):
    total: int = 0
    done: int = 0
    ok: int = 0
    failed: int = 0
    running: int = 0
    degenerate: int = 0
    """Ended rollouts graded `degenerate` (`schema.rollout_health`), ok or not: trainers skip them."""


NO_ENGINE = "none"
"""`RunSummary.engine_used` of a run whose harness calls no model (oracle, nop)."""


class RunSummary(BaseModel):
    """One row of `GET /admin/runs`."""

    id: str
    state: RunState
    plan: RunPlan
    created_at: float
    finished_at: float | None = None
    counts: RunCounts = Field(default_factory=RunCounts)
    mean_reward: float | None = None
    """`mean_reward` of the finished rollouts' rewards (a null reward is never counted as 0)."""
    pass_rate: float | None = None
    """`pass_rate` of the finished rollouts' rewards."""
    failures: dict[str, int] = Field(default_factory=dict)
    """Failed rollouts by error kind."""
    error: str | None = None
    path: str = ""
    left_out: list[str] = Field(default_factory=list)
    """Task folders of a dataset taken whole that are not tasks Harbor can run, as `file: why`:
    the run has no rollout for them."""
    engine_used: str | None = None
    """The engine the run's rollouts call, settled when it (last) started: "embedded" for the
    embedded engine, else the engine's base URL (a plan's "embedded" names the server's default
    engine, which may be a URL), or `NO_ENGINE` for a harness that calls no model. None for a run
    an older tapdeck wrote."""
    engine_model_used: str | None = None
    """The model name those calls named (the plan's `engine_model`, else the server's default
    engine's), settled with `engine_used`; None when none was named (the engine's only served
    model), for a harness that calls no model, or for a run an older tapdeck wrote. A resume
    calls the same engine and model again."""


class RunList(BaseModel):
    """`GET /admin/runs`: every run in the server's data dir."""

    runs: list[RunSummary]


class RunDetail(RunSummary):
    """`GET /admin/runs/{id}`: the summary and every rollout (finished or live)."""

    rollouts: list[RolloutResult]


class ExportRequest(BaseModel):
    """`POST /admin/runs/{id}/export` body."""

    format: Literal["jsonl", "parquet"] = "jsonl"

    @field_validator("format", mode="before")
    @classmethod
    def _any_case(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value  # as `tapdeck export --format`


class ExportResult(BaseModel):
    """`POST /admin/runs/{id}/export` answer: where the rows went (a path on the server's machine)."""

    path: str
    rows: int
    skipped: dict[str, str] = Field(default_factory=dict)
    """Rollouts left out, by id, and why (no session, eval tier, ...)."""
