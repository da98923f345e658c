"""Replay: a captured rollout's sampled tokens scored under a reference engine, and the drift
between the two (`POST /admin/sessions/{id}/replay`, `tapdeck replay`).

Δ is the reference's logprob minus the sampler's, per sampled token: the ratio exp(Δ) is the
importance weight a trainer that plays the reference would apply. The figures are keyed by the
names TRL and verl log them under (runner/replay/drift.py).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ReplayRequest(BaseModel):
    """The body of `POST /admin/sessions/{id}/replay`."""

    model_config = ConfigDict(extra="forbid")

    engine: str = "embedded"
    """`embedded` (the server's embedded engine), or any engine address (HOST:PORT, http://…/v1)."""
    model: str | None = None
    """The model on that engine (default: the one it serves first)."""
    api_key: str | None = None


class DriftToken(BaseModel):
    """One sampled token where the two engines disagree most."""

    seq: int
    index: int
    """Its position among its turn's sampled tokens."""
    token_id: int
    text: str | None
    sampler_logprob: float
    reference_logprob: float
    delta: float


class DriftFigures(BaseModel):
    """Drift over a set of scored tokens (a turn, a session, a run)."""

    tokens: int
    """Sampled tokens scored (both logprobs known)."""
    metrics: dict[str, float]
    """By the RL libraries' names: TRL's `sampling/sampling_logp_difference/{mean,max}` (|Δ|),
    `sampling/importance_sampling_ratio/outside_frac` (exp(Δ) outside [0.5, 2]), verl's
    `rollout_corr/k3_kl` (mean of exp(Δ) − Δ − 1)."""
    largest: list[DriftToken]
    """The tokens with the largest |Δ|, largest first."""


class TurnDrift(BaseModel):
    """One captured turn under the reference: scored, or why it could not be (never Δ = 0)."""

    seq: int
    scored: bool
    reason: str | None = None
    """Why the turn could not be scored (no token ids, no sampler logprobs, past the context), or,
    for a scored one, how many of its tokens were left out for want of a logprob."""
    figures: DriftFigures | None = None


class ReplayResult(BaseModel):
    """One replay of one session, stored beside its capture (the capture itself is never changed)."""

    id: str
    session_id: str
    engine: str
    """The reference engine as given (`embedded`, or its address without credentials)."""
    model: str
    created_at: float
    requests: int
    """Requests sent: one per chain of turns (its longest prefix that fits the reference)."""
    chunked: bool
    """True when some chain was longer than the reference's context: its turns up to the context
    were scored, the later ones are reported as not fitting."""
    turns: list[TurnDrift]
    session: DriftFigures | None
    """Over every scored token of the session; None when no turn could be scored."""


class ReplayList(BaseModel):
    """A session's stored replays, oldest first."""

    replays: list[ReplayResult]


class RunReplay(BaseModel):
    """Every session of a run replayed under one reference, with the run's drift."""

    run_id: str
    replays: list[ReplayResult]
    run: DriftFigures | None
    skipped: list[str]
    """Sessions left out, each with why (`s-…: no token ids (tier text)`)."""


class ReplayTurnLogprobs(BaseModel):
    """One scored turn's sampled tokens under both engines, position by position (None: that engine
    gave no logprob for the token)."""

    seq: int
    sampler: list[float | None]
    reference: list[float | None]


class ReplayLogprobs(BaseModel):
    """A replay's per-token logprobs (`GET /admin/sessions/{id}/replays/{replay_id}/logprobs`): the
    scored turns only, oldest first; what the TUI colours by Δ and buckets |Δ| from."""

    replay_id: str
    turns: list[ReplayTurnLogprobs]
