"""Rollout health: the `degenerate` grade a rollout gets before it reaches a trainer.

A train rollout is degenerate, and trainers skip it as unscorable, when it made a single model
call, when no token the agent sampled is trainable, or when the share of the agent's sampled
tokens that are trainable (its loss-mask fraction) is below the rollout's threshold. The proxy
grades it (`proxy/capture/validation.py`) with one WARN finding per reason, code `degenerate`,
detail `<reason>: <why>`; the runner counts the graded rollouts per run (`RunCounts.degenerate`).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any

DEGENERATE = "degenerate"
"""The rollout-level finding code of the grade."""

DEFAULT_MIN_LOSS_MASK_FRACTION = 0.5
"""Below this share of the agent's sampled tokens in the loss, a rollout is degenerate: its
reward, earned by the whole trajectory, would then mostly credit tokens the gradient never sees.
At 0.5 a rollout with one untrainable turn among several still trains. 0 turns the check off."""


class DegenerateReason(StrEnum):
    """Why a rollout is degenerate (the first word of its finding's detail)."""

    SINGLE_CALL = "single_call"
    NO_TRAINABLE_TOKEN = "no_trainable_token"
    LOW_LOSS_MASK_FRACTION = "low_loss_mask_fraction"


_REASONS = frozenset(r.value for r in DegenerateReason)


def degenerate_reasons(findings: Iterable[Any]) -> list[DegenerateReason]:
    """The reasons a rollout's findings (`Finding`s or their JSON dicts) grade it degenerate;
    empty when they do not."""
    out = []
    for f in findings:
        code, detail = (f.get("code"), f.get("detail")) if isinstance(f, dict) else (f.code, f.detail)
        if code != DEGENERATE:
            continue
        word = str(detail or "").split(":", 1)[0]
        if word in _REASONS:
            out.append(DegenerateReason(word))
    return out


def loss_mask_fraction(value: str | float) -> float:
    """A loss-mask fraction threshold from a number or its text (an argparse type): from 0 to 1,
    else ValueError."""
    number = float(value)
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"a loss-mask fraction is from 0 to 1, not {value}")
    return number
