"""The catalog on the wire (`GET /admin/catalog`): what the server's machine can run, and why not."""

from __future__ import annotations

from pydantic import BaseModel, Field


class TaskInfo(BaseModel):
    """A task as the catalog lists it."""

    name: str
    instruction: str
    """Its opening line (the first paragraph, up to 200 characters)."""
    instruction_text: str = ""
    """The instruction as the agent reads it, up to 4,000 characters (cut with `…`)."""


class DatasetInfo(BaseModel):
    """A dataset, its tasks, or why it could not be listed."""

    name: str
    source: str
    tasks: list[TaskInfo]
    error: str | None = None


class HarnessInfo(BaseModel):
    """One harness row with its availability here."""

    name: str
    dialect: str
    placement: str
    validated: bool
    available: bool
    why: str
    version: str | None = None
    """The pinned version tapdeck installs (agent CLIs); `validated` refers to it."""
    installed: str | None = None
    """What is installed here, e.g. `0.169.0, 423 MB` (agent CLIs); None when not installed."""


class SandboxInfo(BaseModel):
    """One sandbox backend: `import_path` set for tapdeck's host sandbox, else a Harbor type."""

    name: str
    available: bool
    why: str
    import_path: str | None = None


class EngineInfo(BaseModel):
    """One inference engine."""

    name: str
    url: str | None
    tier: str | None
    reachable: bool
    why: str
    served_model: str | None = None
    context_tokens: int | None = None
    """The context length the engine lists (`max_model_len`), None when it does not say."""
    embedded: bool = False
    """tapdeck's embedded engine (a small CPU model): rollouts on it get the harnesses' embedded
    defaults (`Catalog.harness_defaults`); on any other engine the harness's own requests stand."""


class HarnessDefaultsInfo(BaseModel):
    """One harness's defaults on the embedded engine (`rollout_settings.HARNESS_DEFAULTS`)."""

    harness: str
    tool_profile: str | None
    """`lean` where the harness has that profile, else None (its only tool set)."""
    first_prompt_tokens: int
    """Its first prompt with that profile, as measured on the embedded engine."""
    on_cut_reply: str
    """What it does with a reply cut at its output limit: fatal, retries, ends, re-asks."""
    output_tokens: int
    """Output tokens per call."""
    agent_timeout_s: float
    """The agent timeout it gets at least (a task's shorter one gives way), at the default turns."""


class Catalog(BaseModel):
    """The whole catalog (the body of `GET /admin/catalog`)."""

    datasets: list[DatasetInfo]
    harnesses: list[HarnessInfo]
    sandboxes: list[SandboxInfo]
    engines: list[EngineInfo]
    defaults: dict[str, str]
    settings_defaults: dict[str, str] = Field(default_factory=dict)
    """Each rollout setting and its default (`rollout_settings.defaults_table`)."""
    harness_defaults: list[HarnessDefaultsInfo] = Field(default_factory=list)
    """The per-harness defaults on the embedded engine (`rollout_settings.harness_defaults`)."""
