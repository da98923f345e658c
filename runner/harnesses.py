"""Harness seams: how each agent harness is pointed at the capture proxy.

One row per harness: the Harbor agent that runs it, the wire dialect it speaks, how its model calls
are routed to the proxy (Harbor's `AgentConfig.base_url` + `model_name` + `model_api_format`, which
Harbor projects into the harness's own env vars or config file), where it runs, and whether it was
validated on this project (only harnesses actually run end to end here count as validated).

The only credential a harness ever gets is the capture session key: every API-key variable the
harness reads is set to it explicitly (Harbor otherwise falls back to the host's environment, which
may hold a real provider key), and real-looking secrets are stripped from any extra env passed in.
Anything Harbor can load (`module:Class`) runs as an unvalidated harness.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tapdeck.runner import harbor_api


class Placement(StrEnum):
    """Where a harness's agent loop runs."""

    HOST_SIDE = "host-side"
    """In the Harbor process; the sandbox is only reached through `exec` (any sandbox works)."""
    INSTALLED = "installed"
    """Installed into the sandbox at setup (needs internet there, and the proxy reachable from it)."""
    NO_MODEL = "no-model"
    """Makes no model calls (oracle, nop)."""
    HOST_INSTALL = "host-install"
    """A real agent CLI installed by tapdeck on the host (`tapdeck harness install`) and run in
    the host sandbox from there, offline (`cli_agents`)."""


class Dialect(StrEnum):
    """The wire dialect a harness speaks to the proxy (the proxy's dialect names)."""

    CHAT = "chat"
    RESPONSES = "responses"
    ANTHROPIC = "anthropic"
    GOOGLE = "google"
    NONE = "none"


# The proxy's session `base_urls` key and Harbor's `model_api_format` for each dialect.
_BASE_URL_KEY = {
    Dialect.CHAT: "openai",
    Dialect.RESPONSES: "openai",
    Dialect.ANTHROPIC: "anthropic",
    Dialect.GOOGLE: "google",
}
_API_FORMAT = {
    Dialect.CHAT: "openai_chat_completions",
    Dialect.RESPONSES: "openai_responses",
    Dialect.ANTHROPIC: "anthropic_messages",
    Dialect.GOOGLE: "google_generate_content",
}


@dataclass(frozen=True)
class Harness:
    """One row of the seam table."""

    name: str
    """tapdeck's name for it (the Harbor agent name for built-ins)."""
    agent: str
    """Harbor agent name, or `module:Class` import path."""
    dialect: Dialect
    placement: Placement
    model_prefix: str = ""
    """LiteLLM-style provider prefix of `model_name` (`openai/<served>`)."""
    key_env: tuple[str, ...] = ()
    """Env vars the harness (or Harbor for it) reads the API key from: all set to the session key."""
    base_url_env: tuple[str, ...] = ()
    """Env vars carrying the proxy URL (Harbor projects `base_url` into these)."""
    config_file: str | None = None
    """A config file Harbor writes with the base URL, when the harness reads one instead of env."""
    validated: bool = False
    """Run end to end here (through Harbor and the host sandbox)."""
    notes: str = ""
    default_kwargs: dict[str, Any] = field(default_factory=dict)
    version: str | None = None
    """The pinned version tapdeck installs (host-install rows); `validated` refers to it."""

    @property
    def makes_model_calls(self) -> bool:
        """False for oracle/nop (Harbor refuses model overrides on them)."""
        return self.placement is not Placement.NO_MODEL

    @property
    def model_api_format(self) -> str | None:
        """Harbor's `ModelApiFormat` value for this harness's dialect."""
        return _API_FORMAT.get(self.dialect)


_OPENAI_KEYS = ("OPENAI_API_KEY",)
_INSTALLED_NOTE = "installed in the sandbox at setup: needs internet there and the proxy reachable"

# The real agent CLIs tapdeck installs itself: dialect, what carries the proxy URL, and whether the
# pinned version ran end to end here (host sandbox, embedded engine, through the proxy).
_CLI_SEAMS: dict[str, tuple[Dialect, tuple[str, ...], tuple[str, ...], str | None, bool, str]] = {
    "codex": (
        Dialect.RESPONSES,
        ("TAPDECK_SESSION_KEY",),
        (),
        "-c model_providers.tapdeck.* (base_url, env_key, wire_api=responses)",
        True,
        "`codex exec`, a custom model provider; plugins, analytics, update check off; "
        "ran here on sample/hello-file (8.7k-token first prompt, one chain, reward 0)",
    ),
    "claude-code": (
        Dialect.ANTHROPIC,
        ("ANTHROPIC_API_KEY",),
        ("ANTHROPIC_BASE_URL",),
        None,
        True,
        "`claude -p --max-turns`; telemetry, error reports, updater, non-essential "
        "traffic off; ran here on sample/hello-file (12.4k-token first prompt, 3 "
        "agent turns in one chain, reward 0)",
    ),
    "gemini-cli": (
        Dialect.GOOGLE,
        ("GEMINI_API_KEY",),
        ("GOOGLE_GEMINI_BASE_URL",),
        "~/.gemini/settings.json (api-key auth, telemetry off, maxSessionTurns, maxOutputTokens override)",
        True,
        "`gemini --yolo -m <served> -p` (a named model skips its router call); the "
        "workspace trusted by env; ran here on sample/hello-file (11.2k-token first "
        "prompt, one agent turn, reward 0)",
    ),
    "opencode": (
        Dialect.CHAT,
        ("TAPDECK_SESSION_KEY",),
        (),
        "opencode.json (openai-compatible provider baseURL, key from env)",
        True,
        "`opencode run`; its concurrent title call is an auxiliary root; "
        "model fetch, autoupdate, share off; registry pointed nowhere; ran here on "
        "sample/hello-file (7.7k-token first prompt, one chain, reward 0)",
    ),
    "qwen-code": (
        Dialect.CHAT,
        ("OPENAI_API_KEY",),
        ("OPENAI_BASE_URL",),
        "~/.qwen/settings.json (usage stats off, maxSessionTurns, max_tokens, managed memory off)",
        True,
        "`qwen --yolo`; vendored rg made executable at install; ran here on "
        "sample/hello-file with the lean tool profile (9.6k-token first prompt, one "
        "agent turn, graded by the verifier)",
    ),
    "mini-swe-agent": (
        Dialect.CHAT,
        ("OPENAI_API_KEY",),
        (),
        "-c model.model_kwargs.api_base=<proxy>",
        True,
        "`mini -y --exit-immediately`, step_limit = max_turns; not streamed; "
        "ends only on its submit command, so the step limit or budget ends it; "
        "ran here on sample/hello-file (2 turns captured, reward 0); it drops a "
        "reply it rejects and asks again, so each such call is a new root",
    ),
}


CLI_MAX_TURNS = 3
"""Default turn/step limit of the agent CLIs: a small model never finishes, and each first prompt
is 8-17k tokens to prefill on CPU."""
_CLI_CLASSES = {
    "codex": "CodexCli",
    "claude-code": "ClaudeCodeCli",
    "gemini-cli": "GeminiCli",
    "opencode": "OpencodeCli",
    "qwen-code": "QwenCodeCli",
    "mini-swe-agent": "MiniSweAgentCli",
}


def _cli_row(name: str) -> Harness:
    from tapdeck.runner.agent_install import get_package

    dialect, key_env, base_url_env, config_file, validated, notes = _CLI_SEAMS[name]
    return Harness(
        name,
        f"tapdeck.runner.cli_agents:{_CLI_CLASSES[name]}",
        dialect,
        Placement.HOST_INSTALL,
        "",
        key_env,
        base_url_env,
        config_file,
        validated=validated,
        version=get_package(name).version,
        default_kwargs={"max_turns": CLI_MAX_TURNS},
        notes=f"{notes}; runs from tapdeck's install (host sandbox; docker mounts it), per-trial "
        "HOME/TMPDIR, only the session key",
    )


HARNESSES: dict[str, Harness] = {
    h.name: h
    for h in (
        Harness(
            "terminus-2",
            "terminus-2",
            Dialect.CHAT,
            Placement.HOST_SIDE,
            "openai/",
            _OPENAI_KEYS,
            validated=True,
            notes="Harbor's own agent loop (LiteLLM) in the Harbor process; drives tmux in the "
            "sandbox via exec; proxy on loopback works with any sandbox. Run here on the "
            "host sandbox against the embedded engine (calls answered; SmolLM2 never "
            "solves a task, reward 0)",
        ),
        Harness(
            "oracle",
            "oracle",
            Dialect.NONE,
            Placement.NO_MODEL,
            validated=True,
            notes="runs the task's solution/solve.sh (reward 1 on a correct task)",
        ),
        Harness(
            "nop",
            "nop",
            Dialect.NONE,
            Placement.NO_MODEL,
            validated=True,
            notes="does nothing (reward-0 baseline)",
        ),
        *(
            _cli_row(name)
            for name in ("codex", "claude-code", "gemini-cli", "opencode", "qwen-code", "mini-swe-agent")
        ),
        Harness(
            "goose",
            "goose",
            Dialect.CHAT,
            Placement.INSTALLED,
            "openai/",
            _OPENAI_KEYS,
            ("OPENAI_HOST",),
            notes=_INSTALLED_NOTE,
        ),
        Harness(
            "openhands-sdk",
            "openhands-sdk",
            Dialect.CHAT,
            Placement.INSTALLED,
            "openai/",
            ("LLM_API_KEY", "OPENAI_API_KEY"),
            ("LLM_BASE_URL",),
            notes=_INSTALLED_NOTE,
        ),
        Harness(
            "openhands",
            "openhands",
            Dialect.CHAT,
            Placement.INSTALLED,
            "openai/",
            ("LLM_API_KEY", "OPENAI_API_KEY"),
            ("LLM_BASE_URL",),
            notes=_INSTALLED_NOTE,
        ),
        Harness(
            "aider",
            "aider",
            Dialect.CHAT,
            Placement.INSTALLED,
            "openai/",
            _OPENAI_KEYS,
            ("OPENAI_BASE_URL",),
            notes=_INSTALLED_NOTE,
        ),
        Harness(
            "swe-agent",
            "swe-agent",
            Dialect.CHAT,
            Placement.INSTALLED,
            "openai/",
            _OPENAI_KEYS,
            ("OPENAI_BASE_URL",),
            notes=_INSTALLED_NOTE,
        ),
    )
}

DEFAULT_HARNESS = "terminus-2"


@dataclass(frozen=True)
class RunDefaults:
    """Per-rollout values a harness config is built with: a rollout's `ResolvedSettings`
    (`rollout_settings.py`) in the shape the seams take. The field defaults are the embedded
    engine's measured ones (embedded-defaults.md), for building a config without an engine."""

    context_tokens: int = 8192
    max_output_tokens: int | None = 128
    """None: the harness's own request (no limit of tapdeck's)."""
    max_turns: int = 3
    """With the call budget (3 calls a turn) a terminus-2 rollout on the embedded engine ends by
    its turn budget in ~9 short calls."""
    agent_timeout_s: float | None = 180.0
    tool_profile: str | None = None
    """The agent CLIs' tool profile (`cli_agents.TOOL_PROFILES`); None: the CLI's default."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """temperature/top_p/top_k/min_p the harness asks for (terminus-2; the proxy enforces the
    temperature on training sessions for every harness)."""
    model_prefix: str | None = None
    """Override the model-name prefix: `hosted_vllm/` for a vLLM engine (terminus-2 then needs the
    full `model_info`, which is always given, and a name matching `[A-Za-z0-9._-]{1,64}`)."""


_HOSTED_VLLM_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# Env var names that carry credentials; any of these passed as extra env is dropped unless its
# value is the session key itself.
_SECRET_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|AUTH)", re.IGNORECASE)


def get_harness(name: str) -> Harness:
    """The table row for `name`; a `module:Class` path becomes an unvalidated row of its own.

    Raises KeyError naming the known harnesses otherwise.
    """
    if name in HARNESSES:
        return HARNESSES[name]
    if ":" in name:
        return Harness(
            name,
            name,
            Dialect.CHAT,
            Placement.INSTALLED,
            "openai/",
            _OPENAI_KEYS,
            ("OPENAI_BASE_URL",),
            notes="custom Harbor agent loaded by import path (unvalidated; assumed to "
            "speak chat completions through OPENAI_BASE_URL/OPENAI_API_KEY)",
        )
    raise KeyError(
        f"unknown harness {name!r}; known: {', '.join(HARNESSES)} (or any Harbor agent as module:Class)"
    )


def calls_a_model(name: str) -> bool:
    """Whether harness `name` calls a model (False for oracle, nop); an unknown one is assumed to."""
    try:
        return get_harness(name).makes_model_calls
    except KeyError:
        return True


def strip_secrets(env: dict[str, str] | None, session_key: str | None) -> dict[str, str]:
    """Drop credential-looking variables (other than the session key) from an env mapping."""
    return {
        k: v
        for k, v in (env or {}).items()
        if not _SECRET_NAME.search(k) or (session_key is not None and v == session_key)
    }


@dataclass(frozen=True)
class AgentPieces:
    """The Harbor `AgentConfig` fields for one rollout (`to_agent_config()` builds it)."""

    name: str | None
    import_path: str | None
    model_name: str | None
    base_url: str | None
    model_api_format: str | None
    env: dict[str, str]
    kwargs: dict[str, Any]
    override_timeout_sec: float | None

    def to_agent_config(self):
        """Harbor's trial-side `AgentConfig`."""
        fields: dict[str, Any] = {"env": self.env, "kwargs": self.kwargs}
        for key in (
            "name",
            "import_path",
            "model_name",
            "base_url",
            "model_api_format",
            "override_timeout_sec",
        ):
            value = getattr(self, key)
            if value is not None:
                fields[key] = value
        return harbor_api.AgentConfig(**fields)


def terminus2_kwargs(defaults: RunDefaults) -> dict[str, Any]:
    """terminus-2 options for small local models (embedded-defaults.md). Without an output limit it
    asks for none (the engine's own applies); LiteLLM still needs one in `model_info` for a
    `hosted_vllm/` model, which then says the context."""
    output = defaults.max_output_tokens
    return {
        "collect_rollout_details": True,
        "record_terminal_session": False,
        "enable_summarize": False,
        "max_turns": defaults.max_turns,
        "suppress_max_turns_warning": True,
        "model_info": {
            "max_input_tokens": defaults.context_tokens,
            "max_output_tokens": output if output is not None else defaults.context_tokens,
            "input_cost_per_token": 0.0,
            "output_cost_per_token": 0.0,
        },
        "llm_kwargs": {
            **({"max_tokens": output} if output is not None else {}),
            **{k: v for k, v in defaults.sampling.items() if k != "temperature"},
        },
        **({"temperature": defaults.sampling["temperature"]} if "temperature" in defaults.sampling else {}),
    }


def build_agent_pieces(
    harness: str | Harness,
    *,
    base_urls: dict[str, str] | None,
    session_key: str | None,
    served_model: str | None,
    defaults: RunDefaults | None = None,
    agent_kwargs: dict[str, Any] | None = None,
    extra_env: dict[str, str] | None = None,
) -> AgentPieces:
    """Point `harness` at the proxy for one capture session.

    `base_urls` is the session's `{"openai": ".../v1", "anthropic": ..., "google": ...}`,
    `session_key` its API key, `served_model` the engine's served name. `agent_kwargs` are merged
    over the harness defaults; `extra_env` is passed with credential-looking names stripped.
    """
    row = harness if isinstance(harness, Harness) else get_harness(harness)
    defaults = defaults or RunDefaults()
    name, import_path = (None, row.agent) if ":" in row.agent else (row.agent, None)
    kwargs: dict[str, Any] = dict(row.default_kwargs)
    if row.agent == "terminus-2":
        kwargs.update(terminus2_kwargs(defaults))
    kwargs.update(agent_kwargs or {})
    env = strip_secrets(extra_env, session_key)
    if not row.makes_model_calls:
        return AgentPieces(name, import_path, None, None, None, env, kwargs, defaults.agent_timeout_s)

    if not (base_urls and session_key and served_model):
        raise ValueError(
            f"harness {row.name!r} makes model calls: it needs the session's base "
            "URLs, session key and served model name"
        )
    base_url = base_urls[_BASE_URL_KEY[row.dialect]]
    if row.placement is Placement.HOST_INSTALL:
        # tapdeck's own agent classes take the seam as kwargs: Harbor's base_url/model_api_format
        # overrides are for agents with a Harbor model connection, and no key goes into env.
        seam = {
            "proxy_url": base_url,
            "session_key": session_key,
            "max_turns": defaults.max_turns,
            "max_output_tokens": defaults.max_output_tokens,
            "context_tokens": defaults.context_tokens,
            **({"tool_profile": defaults.tool_profile} if defaults.tool_profile else {}),
        }
        # The seam's limits (the rollout's settings) win over the row's defaults; the operator's
        # own kwargs win over both.
        return AgentPieces(
            name,
            import_path,
            served_model,
            None,
            None,
            env,
            {**row.default_kwargs, **seam, **(agent_kwargs or {})},
            defaults.agent_timeout_s,
        )
    prefix = defaults.model_prefix or row.model_prefix
    if prefix == "hosted_vllm/" and not _HOSTED_VLLM_NAME.match(served_model):
        prefix = row.model_prefix
    for var in row.key_env:
        env[var] = session_key
    for var in row.base_url_env:
        env[var] = base_url
    if row.agent == "terminus-2":
        kwargs.setdefault("llm_kwargs", {})["api_key"] = session_key
    return AgentPieces(
        name,
        import_path,
        f"{prefix}{served_model}",
        base_url,
        row.model_api_format,
        env,
        kwargs,
        defaults.agent_timeout_s,
    )


def build_agent_config(harness: str | Harness, **options):
    """`build_agent_pieces(...).to_agent_config()`: Harbor's trial `AgentConfig`."""
    return build_agent_pieces(harness, **options).to_agent_config()


def harness_table() -> list[dict[str, Any]]:
    """The seam table as plain rows (for the catalog, the CLI and the TUI)."""
    return [
        {
            "name": h.name,
            "agent": h.agent,
            "dialect": h.dialect.value,
            "placement": h.placement.value,
            "validated": h.validated,
            "model_name": f"{h.model_prefix}<served>" if h.makes_model_calls else None,
            "key_env": list(h.key_env),
            "base_url_env": list(h.base_url_env),
            "config_file": h.config_file,
            "notes": h.notes,
            "version": h.version,
        }
        for h in HARNESSES.values()
    ]
