"""Drift as the TUI shows it, free of Textual: each token's colour class by Δ (reference logprob −
sampler logprob, from a replay), the token's two logprobs, a session's figures in one line, and a
run's |Δ| histogram as text rows."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from tapdeck.runner.recipes.logprob_mismatch import MAX, MEAN, OUTSIDE
from tapdeck.runner.replay.drift import K3_KL
from tapdeck.schema.replay import DriftFigures, ReplayResult, ReplayTurnLogprobs

LN2 = math.log(2.0)
"""|Δ| at which the ratio exp(Δ) leaves [0.5, 2]: the figures' `outside_frac` counts these tokens."""

TONE_EDGES = (0.05, 0.3, LN2)
"""|Δ| from which a token is `small`, `mid`, `outside` (below the first: `same`)."""

BUCKET_EDGES = (0.0, 0.01, 0.03, 0.1, 0.3, LN2, 1.5)
"""Lower edges of the |Δ| histogram's buckets (the last is open): most tokens of a replay on the
same weights drift by under 0.01 nats, so the small end is finer."""


def token_deltas(pair: ReplayTurnLogprobs | None) -> list[float | None]:
    """Δ per sampled token of a turn; None where an engine gave no logprob (or no replay)."""
    if pair is None:
        return []
    return [
        None if s is None or r is None else r - s for s, r in zip(pair.sampler, pair.reference, strict=False)
    ]


def drift_tone(delta: float | None, masked: bool) -> str:
    """Colour class of one sampled token by |Δ|: masked, unscored (no Δ), or how far apart the
    two engines are on it."""
    if masked:
        return "masked"
    if delta is None:
        return "unscored"
    size = abs(delta)
    if size < TONE_EDGES[0]:
        return "same"
    if size < TONE_EDGES[1]:
        return "small"
    if size < TONE_EDGES[2]:
        return "mid"
    return "outside"


def drift_detail(pair: ReplayTurnLogprobs | None, index: int) -> str:
    """`sampler -0.120 · reference -0.450 · Δ -0.330 (ratio 0.72)` for one token; what is missing
    said as such (`pair` None: the replay did not score the token's turn)."""
    if pair is None or index >= len(pair.sampler):
        return "not scored by the replay"
    sampler, reference = pair.sampler[index], pair.reference[index]
    parts = [
        "sampler ?" if sampler is None else f"sampler {sampler:.3f}",
        "reference ?" if reference is None else f"reference {reference:.3f}",
    ]
    if sampler is not None and reference is not None:
        delta = reference - sampler
        parts.append(f"Δ {delta:+.3f} (ratio {math.exp(delta):.2f})")
    else:
        parts.append("no Δ: an engine gave no logprob")
    return " · ".join(parts)


def figures_line(figures: DriftFigures | None) -> str:
    """A session's (or run's) drift in one line, by the figures' own names shortened."""
    if figures is None:
        return "no turn could be scored"
    m = figures.metrics
    return (
        f"mean |Δ| {m.get(MEAN, math.nan):.3f} · max {m.get(MAX, math.nan):.3f} · "
        f"k3 KL {m.get(K3_KL, math.nan):.2g} · {m.get(OUTSIDE, math.nan):.1%} outside [0.5, 2] · "
        f"{figures.tokens} tok"
    )


def replay_line(replay: ReplayResult) -> str:
    """What a replay measured, against which reference: the detail pane's `drift` line."""
    return f"{figures_line(replay.session)} · vs {replay.model}@{replay.engine}"


@dataclass(frozen=True)
class Bucket:
    """One |Δ| bucket: [low, high) (high None: open) and the tokens in it."""

    low: float
    high: float | None
    count: int


def delta_buckets(deltas: Iterable[float | None]) -> list[Bucket]:
    """The |Δ| of the scored tokens (None left out, never counted as 0) in BUCKET_EDGES' buckets."""
    counts = [0] * len(BUCKET_EDGES)
    for delta in deltas:
        if delta is None or not math.isfinite(delta):
            continue
        size = abs(delta)
        counts[max(i for i, edge in enumerate(BUCKET_EDGES) if size >= edge)] += 1
    highs: list[float | None] = [*BUCKET_EDGES[1:], None]
    return [Bucket(low, high, n) for low, high, n in zip(BUCKET_EDGES, highs, counts, strict=True)]


BAR_EIGHTHS = " ▏▎▍▌▋▊▉█"


def histogram_rows(buckets: list[Bucket], width: int = 40) -> list[str]:
    """One text row per bucket: its |Δ| range, a bar (eighths of a cell) scaled to the fullest
    bucket, the count and its share; about 30 cells plus `width`."""
    total = sum(b.count for b in buckets)
    top = max((b.count for b in buckets), default=0)
    rows = []
    for b in buckets:
        label = f"{b.low:.2f}–{b.high:.2f}" if b.high is not None else f"≥ {b.low:.2f}"
        eighths = round(b.count / top * width * 8) if top else 0
        if b.count and not eighths:
            eighths = 1  # a filled bucket is never blank
        bar = "█" * (eighths // 8) + (BAR_EIGHTHS[eighths % 8] if eighths % 8 else "")
        share = b.count / total if total else 0.0
        rows.append(f"{label:<10} {bar:<{width}} {b.count:>7} {share:>6.1%}")
    return rows


def deltas_line(deltas: list[float | None]) -> str:
    """`1,234 tok · mean |Δ| 0.012 · max 1.200 · 3.1% outside [0.5, 2]` over the scored tokens."""
    sizes = [abs(d) for d in deltas if d is not None and math.isfinite(d)]
    if not sizes:
        return "no scored tokens"
    outside = sum(s >= LN2 for s in sizes) / len(sizes)
    return (
        f"{len(sizes):,} tok · mean |Δ| {sum(sizes) / len(sizes):.3f} · max {max(sizes):.3f} · "
        f"{outside:.1%} outside [0.5, 2]"
    )
