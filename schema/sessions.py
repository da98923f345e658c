"""Capture sessions on the wire: what `/admin/sessions` and its sub-routes answer."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

from tapdeck.schema.findings import Finding

SessionState = Literal["open", "closed", "interrupted"]
LinkKind = Literal["root", "prefix", "retokenized", "message"]
PolicyVersion = int | str
"""The weights that sampled a turn, as its engine or trainer names them: a step number, or an
engine's own label (a label of digits is read as its number, so staleness can be counted)."""
PolicySource = Literal["reply", "weight_info", "trainer"]
"""Where a turn's policy version was read: the engine's reply (SGLang's `weight_version`), the
engine's weight-info route before and after the call (vLLM's `GET /weight_info`), or the latest
version the trainer posted (`POST /admin/engines/version`) before and after the call."""


class Tier(StrEnum):
    """What a session captures; decides whether a rollout can be trained on."""

    TOKENS = "tokens"
    LOGPROBS = "logprobs"
    TEXT = "text"


class EngineWait(BaseModel):
    """The default engine a server waits for: its address does not answer yet (`--engine-wait`)."""

    url: str | None
    """The address as given (without credentials); null to a caller without the admin key
    (`/health` asks none)."""
    waited_s: float
    """Seconds since the server started waiting."""
    limit_s: float
    """Seconds it waits in all (`--engine-wait`) before it stops."""

    def line(self) -> str:
        """What the server prints and the TUI's status line shows while it waits."""
        where = f" at {self.url}" if self.url is not None else ""
        return f"waiting for the engine{where} ({self.waited_s:.0f} s)"


class Health(BaseModel):
    """`GET /health`: the server is up; `instance` changes on every start."""

    status: Literal["ok"]
    instance: str
    engine_wait: EngineWait | None = None
    """Set while the server waits for its default engine to answer (sessions and runs on it get a
    503 with Retry-After meanwhile); null once it answered, and on a server with no engine URL."""


EMBEDDED_FINGERPRINT = "tapdeck-embedded-"
"""How tapdeck's embedded engine's replies start their `system_fingerprint` (then its version)."""


def is_embedded_engine(system_fingerprint: str | None) -> bool:
    """Whether replies with this `system_fingerprint` come from tapdeck's embedded engine, however
    it is reached (the server's default, or `--engine URL` in front of a `tapdeck engine`): the
    runner's defaults and the proxy's output cap differ for it."""
    return (system_fingerprint or "").startswith(EMBEDDED_FINGERPRINT)


class EngineRef(BaseModel):
    """Which engine a session talks to (never its API key)."""

    url: str
    model: str | None = None
    max_model_len: int | None = None
    """The engine's context length as its `/models` lists it (None: it does not say)."""
    system_fingerprint: str | None = None
    """What the engine's replies name it (None: they do not); tapdeck's embedded engine says
    `tapdeck-embedded-<version>`, wherever it is reached from."""


class SessionInfo(BaseModel):
    """`POST /admin/sessions` answer: what a harness needs to talk through the proxy."""

    id: str
    api_key: str
    tier: Tier
    rollout_type: Literal["train", "eval"]
    base_urls: dict[str, str]
    engine: EngineRef
    created_at: float
    metadata: dict[str, Any]


class RolloutStats(BaseModel):
    """A rollout graph's counts. `fragmentation` = token segments per real conversation (1.0 = none)."""

    turns: int = 0
    roots: int = 0
    forks: int = 0
    breaks: int = 0
    discarded: int = 0
    trainable_tokens: int = 0
    fragmentation: float = 0.0
    conversations: int = 0


class PolicySpan(BaseModel):
    """The policy versions one rollout's turns were sampled with: its oldest turn's (the first
    stamped one's; a straddling turn gives the version before its update), its newest turn's (a
    straddling turn gives the version after), and how many of its turns straddled an update."""

    oldest: PolicyVersion
    newest: PolicyVersion
    straddled: int = 0


class SessionSummary(RolloutStats):
    """One row of the sessions table (`GET /admin/sessions`, session events): the graph's stats and
    the session's own state."""

    id: str
    state: SessionState
    tier: Tier
    rollout_type: Literal["train", "eval"]
    created_at: float
    last_call_at: float | None = None
    seconds_since_last_call: float | None = None
    calling_since: float | None = None
    """When the oldest of its model calls still unanswered reached the proxy (the server's clock);
    None while no call is in flight."""
    seconds_calling: float | None = None
    """How long that call had waited when this summary was built (clients advance it on their
    own clock, as `seconds_since_last_call`)."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """What the runner annotated: phase, task, reward, run_id, rollout_id, group."""
    fatal: int = 0
    warn: int = 0
    engine: EngineRef
    policy: PolicySpan | None = None
    """The policy versions its turns were sampled with (None: no turn was stamped with one)."""
    calls_awaiting_engine: int = 0
    """Calls of this session the engine refuses with a 503 right now (it is updating its weights),
    which the proxy is resending: the board's "engine updating"."""


class SessionList(BaseModel):
    """`GET /admin/sessions`: every session the server knows, newest first."""

    sessions: list[SessionSummary]


class SessionDetail(SessionSummary):
    """`GET /admin/sessions/{id}`: the summary and every session, turn and rollout finding."""

    findings: list[Finding] = Field(default_factory=list)


class TurnDetail(BaseModel):
    """`GET /admin/sessions/{id}/turns/{seq}`: everything the TUI shows for one turn."""

    seq: int
    parent: int | None
    link_kind: LinkKind
    request: dict[str, Any] | None
    response: dict[str, Any] | None
    prompt_len: int | None
    sampled_ids: list[int] | None
    token_texts: list[str] | None
    logprobs: list[float | None] | None
    top_logprobs: list[list[tuple[str, float]]] | None
    """Per sampled token, its top alternatives as (token, logprob) (None: none captured)."""
    mask: list[int] | None
    finish_reason: str | None
    findings: list[Finding]
    sampling: dict[str, Any] | None
    meta: dict[str, Any]
    """What the proxy noted on the call: usage, capture_mode (token-in), call_role, synthetic."""
    policy_version: PolicyVersion | None = None
    """The policy version that sampled it (None: unknown, or it straddled an update)."""
    policy_version_straddled: tuple[PolicyVersion | None, PolicyVersion | None] | None = None
    """(before, after): the call was in flight while the weights changed, so no one version
    sampled all of it (None: it did not straddle)."""
    policy_source: PolicySource | None = None


class TurnHeader(BaseModel):
    """One captured call as it was linked, without its tokens (events, the incremental graph)."""

    seq: int
    parent: int | None
    link_kind: LinkKind
    link_offset: int | None = None
    capture_mode: Literal["ids", "text"]
    prompt_len: int | None
    sampled_len: int | None
    finish_reason: str | None
    created_at: float
    findings: list[Finding]
    policy_version: PolicyVersion | None = None
    """The policy version that sampled it (None: unknown, or it straddled an update)."""
    policy_version_straddled: tuple[PolicyVersion | None, PolicyVersion | None] | None = None
    """(before, after) when the weights changed while the call was in flight."""


class RolloutTurn(TurnHeader):
    """One turn of the rollout document: its header, its place in the graph now, its messages."""

    role: str
    """agent | auxiliary | discarded (can change as later calls arrive)."""
    discarded: bool
    trainable: bool
    request: dict[str, Any] | None
    response: dict[str, Any] | None
    sampling: dict[str, Any] | None
    meta: dict[str, Any]


class GraphTurn(TurnHeader):
    """A turn of the incremental graph view: its header and its place in the graph now."""

    role: str
    """agent | auxiliary | discarded (can change as later calls arrive: see `GraphView.links`)."""
    token_in: Literal["ids", "text"] | None
    """Token-in sessions: whether the call continued from stored ids or fell back to text."""


class GraphView(BaseModel):
    """`GET /admin/sessions/{id}/graph?since=N`: what the Rollout screen needs to draw and update
    the graph, without a token or a message: headers of turns `since` on, every turn's current
    parent and role (adoption and discards change older turns), the stats, session findings."""

    session_id: str
    tier: Tier
    rollout_type: Literal["train", "eval"]
    since: int
    stats: RolloutStats
    turns: list[GraphTurn]
    links: list[tuple[int, int | None, str]]
    """(seq, parent, role) of every turn, in arrival order."""
    findings: list[Finding]
    """Session-level findings (the probe's, engine faults); each turn's are on its header."""


class RolloutSequence(BaseModel):
    """One root→leaf training sequence of the rollout document."""

    nodes: list[int]
    role: str
    input_ids: list[int] | None
    loss_mask: list[int] | None
    logprobs: list[float] | None
    routed_experts: str | None = None
    """The engine's MoE routing of every input id but the last, as vLLM sends it (base64 `.npy`
    of a (tokens - 1, layers, experts per token) integer array); None when it sent none."""
    spans: list[dict[str, int]]
    findings: list[Finding]


class RolloutPath(BaseModel):
    """One root→leaf path of the graph and its role."""

    nodes: list[int]
    role: str


class RolloutDocument(BaseModel):
    """`GET /admin/sessions/{id}/rollout`: the whole rollout (also what export writes)."""

    schema_version: int
    session_id: str | None
    tier: Tier
    rollout_type: Literal["train", "eval"]
    ok: bool
    reward: float | None
    """None = never graded: never read as 0."""
    metadata: dict[str, Any]
    stats: RolloutStats
    paths: list[RolloutPath]
    sequences: list[RolloutSequence]
    turns: list[RolloutTurn]
    findings: list[Finding]
    policy: PolicySpan | None = None
    """The policy versions its turns were sampled with (None: none was stamped)."""


class TraceEntry(BaseModel):
    """One agent call of the training trace (OpenEnv's `TrainingTurn` shape)."""

    node_id: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    per_token_logps: list[float]
    loss_mask: list[int]
    request: dict[str, Any]
    response: dict[str, Any]
    metadata: dict[str, Any]


class TrainingTrace(BaseModel):
    """`GET /admin/sessions/{id}/trace`: per-call training data (refused, 409, for eval rollouts)."""

    schema_version: int
    session_id: str | None
    tier: Tier
    reward: float | None
    turns: list[TraceEntry]


class EngineVersionPost(BaseModel):
    """`POST /admin/engines/version` body: the policy version an engine serves from now on, as the
    trainer that just synced its weights says (grpo-trl and cpu-grpo post after every sync)."""

    version: PolicyVersion
    engine: str | None = None
    """The engine's URL, as sessions name it (with or without `/v1`); None: every engine."""


class EngineVersion(BaseModel):
    """What the server knows of one engine's current policy version."""

    engine: str | None
    """The engine's URL without `/v1`; None: the version a trainer posted for every engine."""
    version: PolicyVersion | None
    source: PolicySource
    at: float
    """When it was posted or last read (the server's clock)."""


class EngineVersions(BaseModel):
    """`GET` and `POST /admin/engines/version`: every engine's current policy version known."""

    engines: list[EngineVersion]

    def current(self, engine_url: str | None) -> PolicyVersion | None:
        """The version an engine at `engine_url` serves now: its own, else one posted for all."""
        own = engine_root(engine_url) if engine_url else None
        for entry in self.engines:
            if own is not None and entry.engine == own:
                return entry.version
        return next((e.version for e in self.engines if e.engine is None), None)


def engine_root(url: str) -> str:
    """An engine URL as versions are keyed: no trailing slash, no `/v1`."""
    return url.rstrip("/").removesuffix("/v1")


def staleness(current: PolicyVersion | None, oldest: PolicyVersion | None) -> int | None:
    """How many versions the policy moved since a rollout's oldest turn was sampled (None: either
    is unknown or not a number)."""
    if type(current) is int and type(oldest) is int:
        return current - oldest
    return None
