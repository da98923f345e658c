"""The sampler–trainer mismatch of one training step: how far the engine's logprob of each sampled
token lies from the trainer's own, over the tokens the step trains on.

Named as TRL 1.16's GRPOTrainer names them when it samples through vLLM with its importance-sampling
correction on (`sampling/sampling_logp_difference/{mean,max}`: mean and max of |trainer − engine|).
TRL has no name for the share of tokens whose ratio exp(trainer − engine) lies outside [0.5, 2]: it
is tapdeck's, beside TRL's `sampling/importance_sampling_ratio/{min,mean,max}`. A step where these
jump sampled from weights (or a numerics path) the trainer does not have.

Pure Python (3.11-clean): the recipe hands over the two logprob lists it read from its tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MEAN = "sampling/sampling_logp_difference/mean"
MAX = "sampling/sampling_logp_difference/max"
OUTSIDE = "sampling/importance_sampling_ratio/outside_frac"
RATIO_RANGE = (0.5, 2.0)
"""A token's ratio exp(trainer − engine) outside this range counts in `OUTSIDE`."""


def mismatch_metrics(trainer: Sequence[float], engine: Sequence[float]) -> dict[str, float]:
    """`MEAN`, `MAX` and `OUTSIDE` over paired logprobs of the sampled tokens; a pair with a NaN
    (a token the engine gave no logprob) is left out, as TRL does. Empty when no pair is left."""
    if len(trainer) != len(engine):
        raise ValueError(f"{len(trainer)} trainer logprobs against {len(engine)} engine ones")
    diffs = [t - e for t, e in zip(trainer, engine, strict=True) if not (math.isnan(t) or math.isnan(e))]
    if not diffs:
        return {}
    low, high = (math.log(bound) for bound in RATIO_RANGE)
    return {
        MEAN: sum(abs(d) for d in diffs) / len(diffs),
        MAX: max(abs(d) for d in diffs),
        OUTSIDE: sum(not low <= d <= high for d in diffs) / len(diffs),
    }
