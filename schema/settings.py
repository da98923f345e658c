"""Rollout settings on the wire: what an operator sets in a plan, and what one rollout ran with.

The defaults and the resolution against an engine live in `tapdeck.runner.rollout_settings`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Source = Literal["plan", "task", "engine", "default", "harness-default", "none"]
"""Where a value came from: `harness-default` is the harness's row of the defaults table for this
engine (`rollout_settings.HARNESS_DEFAULTS`), `default` a rule for every harness."""


class RolloutSettings(BaseModel):
    """What a rollout's agent runs with; None everywhere means the stated default."""

    model_config = ConfigDict(extra="forbid")

    agent_timeout_s: float | None = Field(default=None, gt=0)
    """The agent phase's limit, seconds (None → the task's `[agent].timeout_sec`, on the embedded
    engine at least the harness's own default)."""
    max_turns: int | None = Field(default=None, ge=1, le=10_000)
    """Turn/step limit (terminus-2's max_turns, the agent CLIs' turn or step limit)."""
    max_output_tokens: int | None = Field(default=None, ge=1)
    """Output tokens per model call (None → the harness's own request on a served model, the
    harness's default on the embedded engine)."""
    context_tokens: int | None = Field(default=None, ge=256)
    """The context the agent is told it has (None → the engine's; more than it is refused)."""
    temperature: float | None = Field(default=None, ge=0, le=10)
    """Sampling temperature: asked by terminus-2 itself, and enforced by the proxy on every call of
    a training-tier session (None → the harness's own)."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Truncation knobs, asked by terminus-2 (eval tier). At the training tier the proxy resets them
    to their no-ops and records what was asked (a truncated distribution's logprobs do not match
    the trainer's)."""
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    harness_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed verbatim to the Harbor agent, over everything derived above."""

    @field_validator("agent_timeout_s", "temperature", "top_p", "min_p")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @classmethod
    def from_legacy(
        cls, agent_kwargs: dict[str, Any] | None, agent_timeout_s: float | None
    ) -> dict[str, Any]:
        """A plan's old `agent_kwargs`/`agent_timeout_s` as settings fields (`max_turns` lifted out)."""
        kwargs = dict(agent_kwargs or {})
        fields: dict[str, Any] = {}
        if kwargs.get("max_turns") is not None:
            fields["max_turns"] = kwargs.pop("max_turns")
        if kwargs:
            fields["harness_kwargs"] = kwargs
        if agent_timeout_s is not None:
            fields["agent_timeout_s"] = agent_timeout_s
        return fields

    def sampling(self) -> dict[str, Any]:
        """The sampling fields that are set."""
        return {
            k: v for k in ("temperature", "top_p", "top_k", "min_p") if (v := getattr(self, k)) is not None
        }


class ResolvedSettings(BaseModel):
    """The settings one rollout ran with, each with where it came from."""

    context_tokens: int
    context_source: Source
    engine_context_tokens: int | None = None
    """What the engine reported (`max_model_len`), None when it did not say."""
    max_output_tokens: int | None
    """None: no limit of tapdeck's; the harness's own request stands (within the context)."""
    max_output_source: Source
    max_turns: int
    max_turns_source: Source
    agent_timeout_s: float | None
    """None: no agent timeout (neither plan nor task sets one); the hard limit still applies."""
    agent_timeout_source: Source
    hard_limit_s: float
    hard_limit_source: Source
    tool_profile: str | None = None
    """The agent CLI's tool profile (`full`, `lean`); None for a harness that has none."""
    tool_profile_source: Source | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    harness_kwargs: dict[str, Any] = Field(default_factory=dict)

    def line(self) -> str:
        """Everything in one line, each value with its source (the CLI's result, Runs screen)."""
        sampling = "".join(f" · {k}={v}" for k, v in self.sampling.items())
        kwargs = f" · kwargs {', '.join(sorted(self.harness_kwargs))}" if self.harness_kwargs else ""
        output = self.max_output_tokens if self.max_output_tokens is not None else "the harness's own"
        tools = (
            f" · tools {self.tool_profile} ({self.tool_profile_source})"
            if self.tool_profile is not None
            else ""
        )
        return (
            f"{self.timeouts_line()} · context {self.context_tokens} ({self.context_source})"
            f" · output {output} ({self.max_output_source}) · max turns "
            f"{self.max_turns} ({self.max_turns_source}){tools}{sampling}{kwargs}"
        )

    def timeouts_line(self) -> str:
        """`agent 180 s (task) · hard limit 300 s (default)` for tables and the Runs screen."""
        agent = "none" if self.agent_timeout_s is None else f"{self.agent_timeout_s:g} s"
        return (
            f"agent {agent} ({self.agent_timeout_source}) · hard limit "
            f"{self.hard_limit_s:g} s ({self.hard_limit_source})"
        )
