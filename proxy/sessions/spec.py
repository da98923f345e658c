"""What opens a capture session: `POST /admin/sessions`'s body, and its refusals."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from tapdeck.proxy.errors import ProxyError
from tapdeck.proxy.http.limits import MAX_JSON_DEPTH, too_deep
from tapdeck.proxy.upstream.client import NEUTRAL_SAMPLING
from tapdeck.proxy.upstream.tiers import EngineSpec

RolloutType = Literal["auto", "train", "eval"]


class SessionSpec(BaseModel):
    """`POST /admin/sessions` body."""

    engine: EngineSpec | None = None
    """None → the server's default engine."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    call_budget: int | None = Field(default=None, ge=1)
    """After this many captured calls every further call gets a synthetic stop reply."""
    rollout_type: RolloutType = "auto"
    """`train` is refused unless the engine's tier is `tokens`; `auto` → train at `tokens`, else eval."""
    allow_raw_logprobs: bool = False
    """Accept an engine whose logprobs are raw (pre-temperature) for training."""
    training_sampling: dict[str, Any] | None = None
    """The trainer's sampling policy, enforced on every call of a training session: `temperature`
    (finite, > 0) and, optionally, the truncating knobs at their no-op values (anything else is
    refused: the trainer could not reproduce such logprobs). Each turn records what the harness
    requested next to what was sent."""

    token_in: bool | None = None
    """Token-in capture (`proxy/upstream/token_in.py`): a call extending a held conversation continues
    from its stored ids. None → on for training sessions; it needs the tokens tier."""
    max_output_tokens: int | None = Field(default=None, ge=1)
    """Output tokens per call, enforced: a call asking for more (or for no limit) is sent with this
    one, and its turn gets a `max_tokens_capped` finding. None → only the engine's own cap. The
    runner sets it to the rollout's `max_output_tokens` once the engine's context is known, since
    not every agent honours the limit it is configured with."""
    min_loss_mask_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    """The rollout is graded `degenerate` when a smaller share of the agent's sampled tokens is
    in the loss (`schema.rollout_health`). None → `DEFAULT_MIN_LOSS_MASK_FRACTION`."""
    alternatives: int = Field(default=0, ge=0, le=20)
    """Top alternatives per sampled token to capture for inspection (the TUI shows them), as many
    as the engine gave the probe at most. 0, the design's default, asks for none a harness did
    not ask for: they multiply the size of every reply. Harnesses get only what they asked for."""

    @field_validator("metadata")
    @classmethod
    def _metadata_is_storable(cls, value: dict[str, Any]) -> dict[str, Any]:
        if too_deep(value):
            raise ValueError(f"metadata nests deeper than {MAX_JSON_DEPTH} levels")
        return value

    @field_validator("training_sampling")
    @classmethod
    def _policy_is_full_vocabulary(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        unknown = set(value) - {"temperature", *NEUTRAL_SAMPLING}
        if unknown:
            raise ValueError(f"training_sampling: unsupported field(s) {', '.join(sorted(unknown))}")
        policy: dict[str, Any] = {}
        for key, v in value.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"training_sampling: {key} must be a finite number, not {v!r}")
            if key == "temperature":
                if v <= 0:
                    raise ValueError("training_sampling: temperature must be > 0")
                policy[key] = float(v)
            elif v != NEUTRAL_SAMPLING[key] and not (key == "top_k" and v == 0):
                raise ValueError(
                    f"training_sampling: {key} must be {NEUTRAL_SAMPLING[key]} (a "
                    f"truncated distribution's logprobs do not match the trainer's)"
                )
            else:
                policy[key] = NEUTRAL_SAMPLING[key]  # top_k 0 (TRL's "off") is sent as vLLM's -1
        return policy


def base_urls_for(public_url: str) -> dict[str, str]:
    """The base URL each dialect's clients use for a server reachable at `public_url`."""
    root = public_url.rstrip("/")
    return {"openai": f"{root}/v1", "anthropic": root, "google": root}


class SessionError(ProxyError):
    """An admin request about sessions that cannot be honoured (rendered as `status`)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
