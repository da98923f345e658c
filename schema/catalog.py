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
    default_output_tokens: int | None = None
    """The max output tokens a rollout gets on it unless set (`rollout_settings`)."""


class Catalog(BaseModel):
    """The whole catalog (the body of `GET /admin/catalog`)."""

    datasets: list[DatasetInfo]
    harnesses: list[HarnessInfo]
    sandboxes: list[SandboxInfo]
    engines: list[EngineInfo]
    defaults: dict[str, str]
    settings_defaults: dict[str, str] = Field(default_factory=dict)
    """Each rollout setting and its default (`rollout_settings.defaults_table`)."""
