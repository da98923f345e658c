"""Rollout settings: what an agent runs with, set once per plan and resolved against the engine.

`RolloutSettings` is what an operator sets (CLI flags, Setup, a run plan's `settings`): the agent
timeout, the turn/step limit, output tokens, a context limit, the sampling policy and keyword
arguments passed through to the Harbor agent. Every field is optional: None means "the default",
and `resolve` turns it into `ResolvedSettings` for one rollout once the capture session has told
us the engine's context length, recording where each value came from. A value that does not fit the
engine is refused there, before the trial starts, with the field named (`SettingsDoNotFit`).

Defaults, stated once here (and shown by `tapdeck rollout --help`, Setup and `tapdeck info`). They
depend on the engine and the harness, from what each harness was measured to do (`HARNESS_DEFAULTS`):
- context: the engine's own (`max_model_len` of `/v1/models`: vLLM's, and the embedded engine's);
  an engine that does not say is assumed to have `FALLBACK_CONTEXT_TOKENS`.
- On a served model (vLLM or any engine URL, usually on a GPU): no output limit of tapdeck's (the
  harness's own request stands, within the context), each agent CLI's full tool set, the task's
  agent timeout.
- On the embedded engine (known by its replies' `system_fingerprint`, however it is reached; a
  135M model on CPU, whose replies at temperature 1 either end within a few hundred tokens or
  ramble on without end): the lean tool profile where the harness has one, an output limit per
  harness that cuts only a rambling reply (`RUNAWAY_OUTPUT_TOKENS`; codex and claude-code exit on
  a cut reply, so nothing shorter would do), and an
  agent timeout at least long enough for the engine to prefill the harness's first prompt
  `PREFILL_SAFETY` times over and decode every reply that can run to the output limit
  (`embedded_agent_timeout_s`); a task's shorter `[agent].timeout_sec` gives way to it (source
  `harness-default`).
- turns: `DEFAULT_MAX_TURNS`. Hard limit: `DEFAULT_HARD_LIMIT_S`, or the agent timeout plus
  `HARD_LIMIT_MARGIN_S` (sandbox start, setup, verifier) where that is longer.
- sampling: the harness's own unless set.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tapdeck.schema.catalog import HarnessDefaultsInfo
from tapdeck.schema.settings import ResolvedSettings, RolloutSettings, Source

PROMPT_SHARE = 2
"""Output tokens may take at most 1/PROMPT_SHARE of the context: the rest is for the prompt."""
FALLBACK_CONTEXT_TOKENS = 8192
"""Assumed when the engine's `/models` lists no `max_model_len` (a plain OpenAI-compatible server)."""
DEFAULT_MAX_TURNS = 3
"""A small model never finishes; with the call budget (3 calls a turn) a rollout ends by its turns."""
DEFAULT_HARD_LIMIT_S = 300.0
"""Hard limit per rollout, sandbox start included (raised to fit a longer agent timeout)."""
HARD_LIMIT_MARGIN_S = 120.0
"""What a rollout needs beside its agent phase (sandbox start, agent setup, verifier): the hard
limit is at least the agent timeout plus this (300 s over the sample tasks' 180 s, as before)."""
EMBEDDED_OUTPUT_TOKENS = 128
"""Output tokens per call on the embedded engine for a harness with no row in `HARNESS_DEFAULTS`."""
RUNAWAY_OUTPUT_TOKENS = 512
"""A reply of the embedded model this long is a runaway, not an answer cut short. On the agents'
prompts at temperature 1 the 35 replies it ended by itself ran 6-356 tokens, and none of the 48 that
reached 512 ended before a limit (22 of them let run on to 1,024 or beyond; 2026-12-07). Along 10 of
those runaways, the model's own end-of-reply probability at each token gave a median 0.5% chance
of ending between token 512 and 1,024 (one trajectory 62%, the rest under 6%). A harness's limit
there is at least this where a cut reply is fatal to it, and a cut at such a limit is the model's
doing (`model_output`). It was 1,024 before: twice the decode time for more of the same rambling."""

EMBEDDED_PREFILL_TOKENS_PER_S = 36.0
"""The embedded engine's first-prompt prefill, wall tokens per second on 2 cores under the light
load of other checks (F16, one thread): codex's lean 5,748 tokens in 159 s at a load of ~7, gemini-cli's
lean 8,216 in 206 s at ~4-5 (2026-12-07); 8,173 in 197 s at 2-5 (bench/first_call.py, 2026-12-02)."""
EMBEDDED_DECODE_TOKENS_PER_S = 4.0
"""Its decode at a 6-8k-token context, wall tokens per second under that load: 512 tokens in 63 s
(5.7k context, load ~5.5) and in 143 s (8.2k context, load ~6.5), 2026-12-07."""
PREFILL_SAFETY = 3.0
"""How many times over the first prompt's measured prefill the agent timeout allows: at a load of
~10 the engine prefilled 8-17 tokens/s (claude-code's full first call, docs/agents.md)."""
TIMEOUT_STEP_S = 30.0
"""Computed timeouts are rounded up to this."""

CutReply = Literal["fatal", "retries", "ends", "re-asks"]
"""What an agent does with a reply cut at its output limit, measured with its real binary against
an engine that cuts every reply (tests/runner/test_agent_binaries.py): `fatal` exits non-zero at
once; `retries` asks the model to resume, 3 times, then exits non-zero; `ends` ends its loop
(exit 0); `re-asks` feeds the cut back as an error and asks again (turn or call budget ends it)."""


@dataclass(frozen=True)
class HarnessDefaults:
    """One harness: what was measured of it here, and the defaults on the embedded engine that
    follow from that."""

    first_prompt_tokens: int
    """Its first prompt on a sample task with its full tool set, counted by the embedded engine
    (docs/agents.md): an engine whose context cannot hold it would cut the agent on its first call."""
    lean_first_prompt_tokens: int | None
    """The same with the agent CLIs' `lean` tool profile; None: it has no such profile."""
    on_cut_reply: CutReply
    embedded_output_tokens: int
    """Output tokens per call on the embedded engine."""
    replies_per_turn: int = 1
    """The most replies a turn can hold that each run to the output limit: one, unless a cut reply
    leaves the turn open (terminus-2 re-asks without counting a turn, claude-code resumes; the
    call budget's 3 calls a turn bounds both)."""

    @property
    def embedded_tool_profile(self) -> str | None:
        """The tool profile on the embedded engine: lean where there is one."""
        return "lean" if self.lean_first_prompt_tokens is not None else None

    def first_prompt(self, tool_profile: str | None) -> int:
        """The measured first prompt with that tool profile."""
        if tool_profile == "lean" and self.lean_first_prompt_tokens is not None:
            return self.lean_first_prompt_tokens
        return self.first_prompt_tokens

    def embedded_agent_timeout_s(
        self, *, max_turns: int, tool_profile: str | None, output_tokens: int | None
    ) -> float:
        """The shortest agent timeout on the embedded engine: its first prompt's prefill
        `PREFILL_SAFETY` times over, and every reply the turns can hold at the output limit."""
        output = output_tokens or 0
        replies = max_turns * self.replies_per_turn
        seconds = (
            PREFILL_SAFETY * self.first_prompt(tool_profile) / EMBEDDED_PREFILL_TOKENS_PER_S
            + replies * output / EMBEDDED_DECODE_TOKENS_PER_S
        )
        return math.ceil(seconds / TIMEOUT_STEP_S) * TIMEOUT_STEP_S


HARNESS_DEFAULTS: dict[str, HarnessDefaults] = {
    # Its 774-token prompt is prefilled in seconds; it re-asks after a cut without counting a
    # turn, and the call budget (3 a turn) ends it: 128 keeps its 9 calls short.
    "terminus-2": HarnessDefaults(774, None, "re-asks", 128, replies_per_turn=3),
    "mini-swe-agent": HarnessDefaults(1013, None, "re-asks", RUNAWAY_OUTPUT_TOKENS),
    "opencode": HarnessDefaults(7726, 4817, "ends", RUNAWAY_OUTPUT_TOKENS),
    # Any cut reply ends codex with exit 1 ("Incomplete response returned"). It asks for no limit
    # (`model_max_output_tokens` is ignored), so the proxy's cap (8,192 here) was all that bounded
    # a rambling reply: 13 minutes of decoding before that exit.
    "codex": HarnessDefaults(8733, 5751, "fatal", RUNAWAY_OUTPUT_TOKENS),
    "gemini-cli": HarnessDefaults(11400, 8221, "ends", RUNAWAY_OUTPUT_TOKENS),
    # 3 resumes after a cut, then exit 1. Its prompt sets the small model rambling more often
    # than the others' (6 of 7 sampled first replies ran to 512 or 2,048 tokens): its resumes
    # carry it on when one of them ends.
    "claude-code": HarnessDefaults(12200, 4246, "retries", RUNAWAY_OUTPUT_TOKENS, replies_per_turn=3),
    "qwen-code": HarnessDefaults(17206, 9594, "ends", RUNAWAY_OUTPUT_TOKENS),
}
"""The harness table (docs/rollouts.md shows it, `tests/test_readme_claims.py` holds it to this).
On the embedded engine a limit above its natural replies only sets what a rambling reply costs
(512 tokens: 1-2 minutes); terminus-2's 128 cuts more, but it re-asks and nothing fails."""


class SettingsDoNotFit(ValueError):
    """A setting the engine cannot honour; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


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
    embedded: bool = False,
) -> ResolvedSettings:
    """The settings in force for one rollout; SettingsDoNotFit when one does not fit the engine.
    `embedded`: the engine is tapdeck's embedded one (else a served model)."""
    context_source: Source
    turns_source: Source
    row = HARNESS_DEFAULTS.get(harness)
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
    output: int | None
    output_source: Source
    if settings.max_output_tokens is not None:
        output, output_source = settings.max_output_tokens, "plan"
    elif embedded and row is not None:
        output, output_source = row.embedded_output_tokens, "harness-default"
    else:
        output, output_source = (EMBEDDED_OUTPUT_TOKENS if embedded else None), "default"
    if output is not None and output > context // PROMPT_SHARE:
        raise SettingsDoNotFit(
            "max_output_tokens",
            f"{output} does not fit a context of {context} "
            f"tokens (at most 1/{PROMPT_SHARE} of it, {context // PROMPT_SHARE}; "
            "the rest is for the prompt)",
        )
    profile: str | None = None
    profile_source: Source | None = None
    if row is not None and row.lean_first_prompt_tokens is not None:
        asked = settings.harness_kwargs.get("tool_profile")
        if asked is not None:
            profile, profile_source = str(asked), "plan"
        elif embedded:
            profile, profile_source = "lean", "harness-default"
        else:
            profile, profile_source = "full", "default"
    if row is not None and row.first_prompt(profile) + (output or 0) > context:
        first = row.first_prompt(profile)
        field = "max_output_tokens" if output_source == "plan" else "context_tokens"
        with_output = f" plus {output} output tokens" if output is not None else ""
        raise SettingsDoNotFit(
            field,
            f"{harness}'s first prompt (~{first} tokens measured)"
            f"{with_output} does not fit a context of {context} tokens; use an "
            "engine with a longer context",
        )
    turns, turns_source = (
        (settings.max_turns, "plan") if settings.max_turns is not None else (DEFAULT_MAX_TURNS, "default")
    )
    agent_timeout: float | None
    agent_source: Source
    if settings.agent_timeout_s is not None:
        agent_timeout, agent_source = settings.agent_timeout_s, "plan"
    else:
        task = task_agent_timeout(task_path) if task_path is not None else None
        least = (
            row.embedded_agent_timeout_s(max_turns=turns, tool_profile=profile, output_tokens=output)
            if embedded and row is not None
            else None
        )
        if least is not None and (task is None or task < least):
            # The task's limit was set for a served model: the engine could not even read the
            # agent's first prompt in it.
            agent_timeout, agent_source = least, "harness-default"
        elif task is not None:
            agent_timeout, agent_source = task, "task"
        else:
            agent_timeout, agent_source = None, "none"
    hard: float
    hard_source: Source
    if hard_limit_s is not None:
        hard, hard_source = hard_limit_s, "plan"
    else:
        hard = max(DEFAULT_HARD_LIMIT_S, (agent_timeout or 0) + HARD_LIMIT_MARGIN_S)
        hard_source = "default"
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
        tool_profile=profile,
        tool_profile_source=profile_source,
        sampling=settings.sampling(),
        harness_kwargs=dict(settings.harness_kwargs),
    )


def defaults_table() -> list[tuple[str, str]]:
    """(setting, default) rows for `tapdeck info`, Setup and `--help`; `harness_defaults` holds
    the embedded engine's per-harness values these rows refer to."""
    return [
        ("context_tokens", f"the engine's max_model_len ({FALLBACK_CONTEXT_TOKENS} if it does not say)"),
        (
            "max_output_tokens",
            "served model: none of tapdeck's (the harness's own request, within "
            f"the context); embedded engine: per harness; at most "
            f"context/{PROMPT_SHARE}",
        ),
        ("tool_profile", "served model: full; embedded engine: lean where the harness has one"),
        ("max_turns", str(DEFAULT_MAX_TURNS)),
        (
            "agent_timeout_s",
            "the task's [agent].timeout_sec (none if unset); on the embedded "
            "engine at least the harness's, from its first prompt's prefill",
        ),
        (
            "timeout_s (hard limit)",
            f"{DEFAULT_HARD_LIMIT_S:g}, or the agent timeout + {HARD_LIMIT_MARGIN_S:g} where longer",
        ),
        ("temperature, top_p, top_k, min_p", "the harness's own"),
        ("harness_kwargs", "{} (passed verbatim to the Harbor agent)"),
    ]


def harness_defaults(max_turns: int = DEFAULT_MAX_TURNS) -> list[HarnessDefaultsInfo]:
    """`HARNESS_DEFAULTS` on the embedded engine, as `tapdeck info`, Setup and the docs show it."""
    rows = []
    for name, row in HARNESS_DEFAULTS.items():
        profile = row.embedded_tool_profile
        rows.append(
            HarnessDefaultsInfo(
                harness=name,
                tool_profile=profile,
                first_prompt_tokens=row.first_prompt(profile),
                on_cut_reply=row.on_cut_reply,
                output_tokens=row.embedded_output_tokens,
                agent_timeout_s=row.embedded_agent_timeout_s(
                    max_turns=max_turns, tool_profile=profile, output_tokens=row.embedded_output_tokens
                ),
            )
        )
    return rows
