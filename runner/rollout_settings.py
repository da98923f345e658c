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

import tomllib
from pathlib import Path

from tapdeck.schema.settings import ResolvedSettings, RolloutSettings, Source

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
    "terminus-2": 774,
    "mini-swe-agent": 1013,
    "opencode": 7726,
    "codex": 8733,
    "gemini-cli": 11400,
    "claude-code": 12200,
    "qwen-code": 17206,
}
"""Each harness's first prompt on a sample task, measured here (embedded-defaults.md, README): an
engine whose context cannot hold it plus the output tokens would cut the agent on its first call."""
LEAN_FIRST_PROMPT_TOKENS: dict[str, int] = {
    "opencode": 4817,
    "codex": 5751,
    "gemini-cli": 8221,
    "claude-code": 4246,
    "qwen-code": 9594,
}
"""The same with the agent CLIs' `lean` tool profile (`harness_kwargs` `tool_profile: lean`)."""


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


def resolve(
    settings: RolloutSettings,
    *,
    harness: str,
    engine_context: int | None,
    task_path: Path | None,
    hard_limit_s: float | None,
) -> ResolvedSettings:
    """The settings in force for one rollout; SettingsDoNotFit when one does not fit the engine."""
    context_source: Source
    output_source: Source
    agent_timeout: float | None
    agent_source: Source
    hard_source: Source
    turns_source: Source
    if settings.context_tokens is not None:
        if engine_context is not None and settings.context_tokens > engine_context:
            raise SettingsDoNotFit(
                "context_tokens",
                f"{settings.context_tokens} is more than the engine's context of {engine_context} tokens",
            )
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
        raise SettingsDoNotFit(
            "max_output_tokens",
            f"{output} does not fit a context of {context} "
            f"tokens (at most 1/{PROMPT_SHARE} of it, {context // PROMPT_SHARE}; "
            "the rest is for the prompt)",
        )
    lean = settings.harness_kwargs.get("tool_profile") == "lean"
    first = (LEAN_FIRST_PROMPT_TOKENS if lean else FIRST_PROMPT_TOKENS).get(harness)
    if first is not None and first + output > context:
        field = "max_output_tokens" if output_source == "plan" else "context_tokens"
        raise SettingsDoNotFit(
            field,
            f"{harness}'s first prompt (~{first} tokens measured) plus "
            f"{output} output tokens does not fit a context of {context} tokens; "
            "use an engine with a longer context",
        )
    if settings.agent_timeout_s is not None:
        agent_timeout, agent_source = settings.agent_timeout_s, "plan"
    else:
        agent_timeout = task_agent_timeout(task_path) if task_path is not None else None
        agent_source = "task" if agent_timeout is not None else "none"
    hard, hard_source = (
        (hard_limit_s, "plan") if hard_limit_s is not None else (DEFAULT_HARD_LIMIT_S, "default")
    )
    turns, turns_source = (
        (settings.max_turns, "plan") if settings.max_turns is not None else (DEFAULT_MAX_TURNS, "default")
    )
    return ResolvedSettings(
        context_tokens=context,
        context_source=context_source,
        engine_context_tokens=engine_context,
        max_output_tokens=output,
        max_output_source=output_source,
        max_turns=turns,
        max_turns_source=turns_source,
        agent_timeout_s=agent_timeout,
        agent_timeout_source=agent_source,
        hard_limit_s=hard,
        hard_limit_source=hard_source,
        sampling=settings.sampling(),
        harness_kwargs=dict(settings.harness_kwargs),
    )


def defaults_table() -> list[tuple[str, str]]:
    """(setting, default) rows for `tapdeck info`, Setup and `--help`."""
    return [
        ("context_tokens", f"the engine's max_model_len ({FALLBACK_CONTEXT_TOKENS} if it does not say)"),
        (
            "max_output_tokens",
            f"context/{OUTPUT_SHARE}, at least {MIN_OUTPUT_TOKENS}, at most context/{PROMPT_SHARE}",
        ),
        ("max_turns", str(DEFAULT_MAX_TURNS)),
        ("agent_timeout_s", "the task's [agent].timeout_sec (none if unset)"),
        ("timeout_s (hard limit)", f"{DEFAULT_HARD_LIMIT_S:g}"),
        ("temperature, top_p, top_k, min_p", "the harness's own"),
        ("harness_kwargs", "{} (passed verbatim to the Harbor agent)"),
    ]
