"""One captured model call, exactly as the engine answered it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tapdeck.proxy.capture.policy_stamp import PolicyStamp
from tapdeck.schema.findings import Finding


@dataclass
class Turn:
    """One model call: the ids the engine used and sampled, plus the messages around them.

    `prompt_ids` / `sampled_ids` / `logprobs` are None when the engine's tier did not return
    them. `logprobs` is aligned with `sampled_ids`; None means the turn is not trainable.
    """

    session_id: str
    seq: int
    prompt_ids: np.ndarray | None = None
    sampled_ids: np.ndarray | None = None
    logprobs: np.ndarray | None = None
    finish_reason: str | None = None
    request: dict[str, Any] = field(default_factory=dict)
    response: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    token_texts: list[str] | None = None
    top_logprobs: list[list[tuple[str, float]]] | None = None
    findings: list[Finding] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    routed_experts: np.ndarray | None = None
    """MoE routing over prompt and completion, (tokens - 1, layers, experts per token), when the
    engine returned it (`proxy/capture/routing.py`)."""
    content_keys: dict[str, list[str]] | None = None
    """Content keys of the request's messages and tools, when capture already computed them."""
    policy: PolicyStamp | None = None
    """The policy version that sampled it, read before and after the call (None: unknown)."""

    @property
    def has_ids(self) -> bool:
        """True when the engine returned both prompt and sampled ids (the tokens tier)."""
        return self.prompt_ids is not None and self.sampled_ids is not None
