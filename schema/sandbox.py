"""Inside a running rollout's sandbox: a command run there, the processes there, and the agent's
own output (`/admin/runs/{id}/rollouts/{rollout_id}/exec`, `/processes`, `/agent-output`;
`tapdeck exec`; the TUI's sandbox screen).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

EXEC_TIMEOUT_S = 30.0
"""A command's default time limit: long enough for a look around (ls, ps, cat), short enough
that a forgotten `tail -f` does not hold a server request."""
EXEC_TIMEOUT_MAX_S = 600.0
"""The longest limit a request may ask for."""


class ExecRequest(BaseModel):
    """The body of `POST /admin/runs/{id}/rollouts/{rollout_id}/exec`."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1)
    """A bash command line, run in the sandbox's working directory as its default user."""
    timeout_s: float = Field(default=EXEC_TIMEOUT_S, gt=0, le=EXEC_TIMEOUT_MAX_S)
    """Past it the command is killed and the request answers 504."""


class ExecReply(BaseModel):
    """What a command run in a sandbox gave back."""

    exit_code: int
    stdout: str
    stderr: str
    seconds: float
    """How long it ran."""


class SandboxProcess(BaseModel):
    """One process running in a sandbox, as `ps` sees it there."""

    pid: int
    """Its pid in the sandbox's own pid namespace."""
    elapsed_s: int
    """How long it has run."""
    cpu_s: int
    """CPU time it has used (user + system)."""
    command: str
    """Its command line."""


class ProcessList(BaseModel):
    """`GET /admin/runs/{id}/rollouts/{rollout_id}/processes`."""

    rollout_id: str
    processes: list[SandboxProcess]


class AgentOutput(BaseModel):
    """`GET /admin/runs/{id}/rollouts/{rollout_id}/agent-output`: the end of the agent's own
    output, from the log file its harness writes in the sandbox's `/logs/agent` (Harbor's)."""

    rollout_id: str
    file: str | None
    """That file's path in the sandbox (None: the agent has written none yet)."""
    size: int
    """The file's whole size in bytes."""
    text: str
    """Its last bytes, as text, terminal control sequences taken out."""
