"""Rollout settings: what an agent runs with, set once per plan and resolved against the engine.

`RolloutSettings` is what an operator sets (CLI flags, Setup, a run plan's `settings`): the agent
timeout, the turn/step limit, output tokens, a context limit, the sampling policy and keyword
arguments passed through to the Harbor agent. Every field is optional: None means "the default",
and `resolve` turns it into `ResolvedSettings` for one rollout once the capture session has told
us the engine's context length, recording where each value came from. A value that does not fit the
engine is refused there, before the trial starts, with the field named (`SettingsDoNotFit`).

Defaults, stated once here (and shown by `tapdeck rollout --help`, Setup and `tapdeck info`):
- context: the engine's own (`max_model_len` of `/v1/models`: vLLM's, and the embedded engine's);
  an engine that does not say is assumed to have `FALLBACK_CONTEXT_TOKENS`.
- max output tokens: 1/`OUTPUT_SHARE` of the context, at least `MIN_OUTPUT_TOKENS` (128 on the
  embedded engine's 32k: a 135M model on CPU decodes ~5-10 tokens/s and loops to the limit).
- turns: `DEFAULT_MAX_TURNS`. Agent timeout: the task's `[agent].timeout_sec`, none if it has none
  (the hard limit still bounds the rollout). Hard limit: `DEFAULT_HARD_LIMIT_S`.
- sampling: the harness's own unless set.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

OUTPUT_SHARE = 256
"""Default max output tokens = context // OUTPUT_SHARE (at least MIN_OUTPUT_TOKENS)."""
MIN_OUTPUT_TOKENS = 128
PROMPT_SHARE = 2
"""Output tokens may take at most 1/PROMPT_SHARE of the context: the rest is for the prompt."""
FALLBACK_CONTEXT_TOKENS = 8192
"""Assumed when the engine's `/models` lists no `max_model_len` (a plain OpenAI-compatible server)."""
DEFAULT_MAX_TURNS = 3
"""A small model never finishes; with the call budget (3 calls a turn) a rollout ends by its turns."""
DEFAULT_HARD_LIMIT_S = 300.0
"""Hard limit per rollout, sandbox start included."""

FIRST_PROMPT_TOKENS: dict[str, int] = {
    "terminus-2": 774, "mini-swe-agent": 1013, "opencode": 7726, "codex": 8733,
    "gemini-cli": 11400, "claude-code": 12200, "qwen-code": 17206,
}
"""Each harness's first prompt on a sample task, measured here (embedded-defaults.md, README): an
engine whose context cannot hold it plus the output tokens would cut the agent on its first call."""

Source = Literal["plan", "task", "engine", "default", "none"]


class RolloutSettings(BaseModel):
    """What a rollout's agent runs with; None everywhere means the stated default."""

    model_config = ConfigDict(extra="forbid")

    agent_timeout_s: float | None = Field(default=None, gt=0)
    """The agent phase's limit, seconds (None → the task's `[agent].timeout_sec`)."""
    max_turns: int | None = Field(default=None, ge=1, le=10_000)
    """Turn/step limit (terminus-2's max_turns, the agent CLIs' turn or step limit)."""
    max_output_tokens: int | None = Field(default=None, ge=1)
    """Output tokens per model call (None → 1/OUTPUT_SHARE of the context)."""
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
    def from_legacy(cls, agent_kwargs: dict[str, Any] | None,
                    agent_timeout_s: float | None) -> dict[str, Any]:
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
        return {k: v for k in ("temperature", "top_p", "top_k", "min_p")
                if (v := getattr(self, k)) is not None}


class ResolvedSettings(BaseModel):
    """The settings one rollout ran with, each with where it came from."""

    context_tokens: int
    context_source: Source
    engine_context_tokens: int | None = None
    """What the engine reported (`max_model_len`), None when it did not say."""
    max_output_tokens: int
    max_output_source: Source
    max_turns: int
    max_turns_source: Source
    agent_timeout_s: float | None
    """None: no agent timeout (neither plan nor task sets one); the hard limit still applies."""
    agent_timeout_source: Source
    hard_limit_s: float
    hard_limit_source: Source
    sampling: dict[str, Any] = Field(default_factory=dict)
    harness_kwargs: dict[str, Any] = Field(default_factory=dict)

    def line(self) -> str:
        """Everything in one line, each value with its source (the CLI's result, Runs screen)."""
        sampling = "".join(f" · {k}={v}" for k, v in self.sampling.items())
        kwargs = f" · kwargs {', '.join(sorted(self.harness_kwargs))}" if self.harness_kwargs else ""
        return (f"{self.timeouts_line()} · context {self.context_tokens} ({self.context_source})"
                f" · output {self.max_output_tokens} ({self.max_output_source}) · turns "
                f"{self.max_turns} ({self.max_turns_source}){sampling}{kwargs}")

    def timeouts_line(self) -> str:
        """`agent 180 s (task) · hard limit 300 s (default)` for tables and the Runs screen."""
        agent = ("none" if self.agent_timeout_s is None else f"{self.agent_timeout_s:g} s")
        return (f"agent {agent} ({self.agent_timeout_source}) · hard limit "
                f"{self.hard_limit_s:g} s ({self.hard_limit_source})")


class SettingsDoNotFit(ValueError):
    """A setting the engine cannot honour; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def default_output_tokens(context_tokens: int) -> int:
    """The default max output tokens for a context: its 1/OUTPUT_SHARE, at least MIN_OUTPUT_TOKENS."""
    return max(MIN_OUTPUT_TOKENS, context_tokens // OUTPUT_SHARE)


def task_agent_timeout(task_path: Path) -> float | None:
    """The task's own `[agent].timeout_sec` (None when absent or unreadable)."""
    try:
        doc = tomllib.loads((Path(task_path) / "task.toml").read_text())
    except (OSError, ValueError):
        return None
    value = (doc.get("agent") or {}).get("timeout_sec")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def resolve(settings: RolloutSettings, *, harness: str, engine_context: int | None,
            task_path: Path | None, hard_limit_s: float | None) -> ResolvedSettings:
    """The settings in force for one rollout; SettingsDoNotFit when one does not fit the engine."""
    if settings.context_tokens is not None:
        if engine_context is not None and settings.context_tokens > engine_context:
            raise SettingsDoNotFit("context_tokens", f"{settings.context_tokens} is more than the "
                                   f"engine's context of {engine_context} tokens")
        context, context_source = settings.context_tokens, "plan"
    elif engine_context is not None:
        context, context_source = engine_context, "engine"
    else:
        context, context_source = FALLBACK_CONTEXT_TOKENS, "default"
    if settings.max_output_tokens is not None:
        output, output_source = settings.max_output_tokens, "plan"
    else:
        output, output_source = default_output_tokens(context), "default"
    if output > context // PROMPT_SHARE:
        raise SettingsDoNotFit("max_output_tokens", f"{output} does not fit a context of {context} "
                               f"tokens (at most 1/{PROMPT_SHARE} of it, {context // PROMPT_SHARE}; "
                               "the rest is for the prompt)")
    first = FIRST_PROMPT_TOKENS.get(harness)
    if first is not None and first + output > context:
        field = "max_output_tokens" if output_source == "plan" else "context_tokens"
        raise SettingsDoNotFit(field, f"{harness}'s first prompt (~{first} tokens measured) plus "
                               f"{output} output tokens does not fit a context of {context} tokens; "
                               "use an engine with a longer context")
    if settings.agent_timeout_s is not None:
        agent_timeout, agent_source = settings.agent_timeout_s, "plan"
    else:
        agent_timeout = task_agent_timeout(task_path) if task_path is not None else None
        agent_source = "task" if agent_timeout is not None else "none"
    hard, hard_source = ((hard_limit_s, "plan") if hard_limit_s is not None
                         else (DEFAULT_HARD_LIMIT_S, "default"))
    turns, turns_source = ((settings.max_turns, "plan") if settings.max_turns is not None
                           else (DEFAULT_MAX_TURNS, "default"))
    return ResolvedSettings(
        context_tokens=context, context_source=context_source, engine_context_tokens=engine_context,
        max_output_tokens=output, max_output_source=output_source, max_turns=turns,
        max_turns_source=turns_source, agent_timeout_s=agent_timeout,
        agent_timeout_source=agent_source, hard_limit_s=hard, hard_limit_source=hard_source,
        sampling=settings.sampling(), harness_kwargs=dict(settings.harness_kwargs))


def defaults_table() -> list[tuple[str, str]]:
    """(setting, default) rows for `tapdeck info`, Setup and `--help`."""
    return [
        ("context_tokens", "the engine's max_model_len "
                           f"({FALLBACK_CONTEXT_TOKENS} if it does not say)"),
        ("max_output_tokens", f"context/{OUTPUT_SHARE}, at least {MIN_OUTPUT_TOKENS}, at most "
                              f"context/{PROMPT_SHARE}"),
        ("max_turns", str(DEFAULT_MAX_TURNS)),
        ("agent_timeout_s", "the task's [agent].timeout_sec (none if unset)"),
        ("timeout_s (hard limit)", f"{DEFAULT_HARD_LIMIT_S:g}"),
        ("temperature, top_p, top_k, min_p", "the harness's own"),
        ("harness_kwargs", "{} (passed verbatim to the Harbor agent)"),
    ]
