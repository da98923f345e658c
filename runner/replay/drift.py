"""Drift between the engine that sampled a rollout and a reference, over paired logprobs of the
sampled tokens: Δ = reference − sampler per token, the reference in the trainer's place.

The figures reuse the mismatch metrics a training step logs (runner/recipes/logprob_mismatch.py:
TRL's `sampling/sampling_logp_difference/{mean,max}` of |Δ| and the share of ratios exp(Δ) outside
[0.5, 2]), so a replay's number and a training step's mean the same thing, and add verl's
`rollout_corr/k3_kl`: the mean of exp(Δ) − Δ − 1, Schulman's k3 estimate of KL(sampler ‖
reference) from the sampler's own tokens (never negative; 0 only when every Δ is 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tapdeck.runner.recipes.logprob_mismatch import mismatch_metrics
from tapdeck.schema.replay import DriftFigures, DriftToken

K3_KL = "rollout_corr/k3_kl"
LARGEST = 10
"""How many of the tokens with the largest |Δ| a figure lists."""


@dataclass(frozen=True)
class TokenPair:
    """One sampled token with both logprobs (NaN where an engine gave none)."""

    seq: int
    index: int
    token_id: int
    text: str | None
    sampler: float
    reference: float

    @property
    def known(self) -> bool:
        """Both logprobs are numbers: the token can be scored."""
        return not (math.isnan(self.sampler) or math.isnan(self.reference))


def drift_figures(pairs: list[TokenPair]) -> DriftFigures | None:
    """The figures over the pairs both engines gave a logprob for; None when there is none."""
    known = [p for p in pairs if p.known]
    if not known:
        return None
    metrics = mismatch_metrics([p.reference for p in known], [p.sampler for p in known])
    deltas = [p.reference - p.sampler for p in known]
    metrics[K3_KL] = sum(math.expm1(d) - d for d in deltas) / len(deltas)
    order = sorted(range(len(known)), key=lambda i: -abs(deltas[i]))[:LARGEST]
    return DriftFigures(
        tokens=len(known),
        metrics=metrics,
        largest=[
            DriftToken(
                seq=known[i].seq,
                index=known[i].index,
                token_id=known[i].token_id,
                text=known[i].text,
                sampler_logprob=known[i].sampler,
                reference_logprob=known[i].reference,
                delta=deltas[i],
            )
            for i in order
        ],
    )
