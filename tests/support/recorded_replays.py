"""Replays of the recorded sessions (tests/app/fixtures/api.json), for the TUI's drift tests: the
recording holds no replay (it needs a reference engine serving prompt logprobs), so a reference is
made from each turn's own sampled logprobs plus a fixed pattern of Δ, and the documents are built by
the replay's own code (runner/replay/drift.py), as the server would store them."""

from __future__ import annotations

import math

from tapdeck.runner.replay.drift import TokenPair, drift_figures
from tapdeck.schema.replay import ReplayLogprobs, ReplayResult, ReplayTurnLogprobs, TurnDrift

DELTAS = (0.002, -0.02, 0.004, 0.12, -0.001, -0.45, 0.008, 1.2)
"""Δ of the sampled tokens, by index modulo its length: mostly near 0, one in eight outside [0.5, 2]."""
UNSCORED_EVERY = 11
"""Every 11th token has no reference logprob (the reference gave none)."""
CREATED_AT = 900.0


def delta_of(index: int) -> float | None:
    """The Δ the made-up reference puts on sampled token `index` (None: no reference logprob)."""
    return None if index % UNSCORED_EVERY == UNSCORED_EVERY - 1 else DELTAS[index % len(DELTAS)]


def recorded_replay(data: dict, session_id: str) -> tuple[dict, dict]:
    """One replay of a recorded session: its `ReplayResult` and its `ReplayLogprobs` bodies."""
    replay_id = f"rp-{session_id[:8]}"
    turns = data["turns"].get(session_id, {})
    results: list[TurnDrift] = []
    every: list[TokenPair] = []
    logprobs: list[ReplayTurnLogprobs] = []
    for seq in sorted(turns, key=int):
        turn = turns[seq]
        sampler = turn.get("logprobs") or []
        texts = turn.get("token_texts") or []
        ids = turn.get("sampled_ids") or []
        reference = [
            None if s is None or delta_of(i) is None else s + delta_of(i) for i, s in enumerate(sampler)
        ]
        pairs = [
            TokenPair(
                int(seq),
                i,
                int(ids[i]),
                texts[i],
                math.nan if s is None else s,
                math.nan if r is None else r,
            )
            for i, (s, r) in enumerate(zip(sampler, reference, strict=True))
        ]
        figures = drift_figures(pairs)
        results.append(TurnDrift(seq=int(seq), scored=figures is not None, figures=figures))
        every.extend(p for p in pairs if p.known)
        logprobs.append(ReplayTurnLogprobs(seq=int(seq), sampler=sampler, reference=reference))
    result = ReplayResult(
        id=replay_id,
        session_id=session_id,
        engine="embedded",
        model="smollm2",
        created_at=CREATED_AT,
        requests=1,
        chunked=False,
        turns=results,
        session=drift_figures(every),
    )
    body = ReplayLogprobs(replay_id=replay_id, turns=logprobs)
    return result.model_dump(mode="json"), body.model_dump(mode="json")


def with_replays(data: dict, stored: tuple[str, ...] = (), postable: tuple[str, ...] = ()) -> dict:
    """`data` with a stored replay of each session in `stored`, and one that `POST .../replay`
    answers (and then lists) for each in `postable`."""
    data = {**data, "replays": {}, "replay_logprobs": {}, "replay_posts": {}}
    for session_id in stored + postable:
        doc, body = recorded_replay(data, session_id)
        data["replay_logprobs"][doc["id"]] = body
        if session_id in stored:
            data["replays"][session_id] = [doc]
        else:
            data["replay_posts"][session_id] = doc
    return data
