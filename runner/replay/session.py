"""A replay of one session or one run: chains scored under the reference, checked, paired with the
captured logprobs, measured, and stored beside the capture (`Store.save_replay`).

Refused in one line naming what to fix: a session with no token ids (the eval tier), a reference
whose tokenizer differs from the sampler's (it decodes a captured id to other text), a reference
that gives no prompt logprobs. A turn that cannot be scored is reported with its reason, never as
Δ = 0.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import numpy as np

from tapdeck.proxy.capture.turn import Turn
from tapdeck.proxy.store.database import Store
from tapdeck.runner.errors import ReplayRefused, SessionNotReplayable
from tapdeck.runner.replay.chains import token_chains
from tapdeck.runner.replay.drift import TokenPair, drift_figures
from tapdeck.runner.replay.reference import ReferenceEngine
from tapdeck.schema.replay import ReplayLogprobs, ReplayResult, ReplayTurnLogprobs, RunReplay, TurnDrift


def _check_tokenizer(reference: ReferenceEngine, turn: Turn, texts: list[str | None]) -> None:
    """ReplayRefused when the reference decodes a sampled id to other text than the sampler did
    (a vocabulary or special ids that differ). Ids reported as `token_id:N` are not compared."""
    for index, (mine, theirs) in enumerate(zip(turn.token_texts or [], texts, strict=False)):
        if theirs is None or mine.startswith("token_id:") or mine == theirs:
            continue
        token = int(turn.sampled_ids[index]) if turn.sampled_ids is not None else -1
        raise ReplayRefused(
            f"reference engine {reference.name}'s tokenizer differs from the sampler's: token id "
            f"{token} (turn {turn.seq}) is {mine!r} in the capture but {theirs!r} there; replay "
            "against an engine serving the same tokenizer"
        )


def _unscorable(turn: Turn) -> str | None:
    if turn.prompt_ids is None or turn.sampled_ids is None:
        return "no token ids (the engine's tier did not return them)"
    if not turn.prompt_ids.size:
        return "an empty prompt: its first token has nothing to be conditioned on"
    if turn.logprobs is None or turn.logprobs.shape != turn.sampled_ids.shape:
        return "no sampler logprobs to compare with"
    return None


def _score(
    reference: ReferenceEngine, turns: list[Turn]
) -> tuple[dict[int, np.ndarray], dict[int, str], int, bool]:
    """Reference logprobs by turn seq, why the others were not scored, requests sent, and
    whether a chain was cut at the reference's context."""
    by_seq = {t.seq: t for t in turns}
    scored: dict[int, np.ndarray] = {}
    reasons: dict[int, str] = {}
    requests = 0
    chunked = False
    for chain in token_chains(turns):
        # The logprobs of a causal model at a position depend only on the ids before it, so the
        # longest prefix that fits scores every turn ending inside it in one request. A turn past
        # it cannot be scored at all: its own prompt holds that prefix and more.
        fitting = [ct for ct in chain.turns if reference.fits(ct.start + ct.size)]
        for ct in chain.turns[len(fitting) :]:
            chunked = True
            reasons[ct.seq] = (
                f"its {ct.start + ct.size} prompt and completion tokens do not fit the reference's "
                f"context of {reference.max_model_len}"
            )
        if not fitting:
            continue
        last = fitting[-1]
        result = reference.score(chain.ids[: last.start + last.size])
        requests += 1
        for ct in fitting:
            _check_tokenizer(reference, by_seq[ct.seq], result.texts[ct.start : ct.start + ct.size])
            scored[ct.seq] = result.logprobs[ct.start : ct.start + ct.size]
    return scored, reasons, requests, chunked


def replay_session(
    store: Store, session_id: str, reference: ReferenceEngine
) -> tuple[ReplayResult, list[TokenPair]]:
    """Score the session's sampled tokens under `reference`, store the result, and return it with
    the token pairs (for a run's figures). KeyError for an unknown session."""
    record, turns = store.load_session(session_id)
    if not any(t.has_ids for t in turns):
        tier = record.get("tier", "text")
        raise SessionNotReplayable(
            f"session {session_id} holds no token ids (tier {tier}, {len(turns)} turn(s)): only a "
            "capture at the tokens tier can be replayed; capture through an engine that returns "
            "token ids (vLLM, or the embedded engine)"
        )
    scored, reasons, requests, chunked = _score(reference, turns)
    results: list[TurnDrift] = []
    every: list[TokenPair] = []
    for turn in turns:
        why = _unscorable(turn) or reasons.get(turn.seq)
        ref = scored.get(turn.seq)
        if why is not None or ref is None or turn.sampled_ids is None or turn.logprobs is None:
            results.append(TurnDrift(seq=turn.seq, scored=False, reason=why))
            continue
        texts = turn.token_texts or []
        pairs = [
            TokenPair(
                turn.seq,
                i,
                int(token),
                texts[i] if i < len(texts) else None,
                float(turn.logprobs[i]),
                float(ref[i]),
            )
            for i, token in enumerate(turn.sampled_ids.tolist())
        ]
        figures = drift_figures(pairs)
        if figures is None:
            results.append(
                TurnDrift(
                    seq=turn.seq, scored=False, reason="neither engine gave a logprob for the same token"
                )
            )
            continue
        every.extend(p for p in pairs if p.known)
        missing = len(pairs) - figures.tokens
        partly = (
            f"{missing} of {len(pairs)} tokens left out: an engine gave no logprob for them"
            if missing
            else None
        )
        results.append(TurnDrift(seq=turn.seq, scored=True, reason=partly, figures=figures))
    result = ReplayResult(
        id=f"rp-{secrets.token_hex(6)}",
        session_id=session_id,
        engine=reference.name,
        model=reference.model,
        created_at=time.time(),
        requests=requests,
        chunked=chunked,
        turns=results,
        session=drift_figures(every),
    )
    store.save_replay(result.model_dump(mode="json"), {t.seq: scored.get(t.seq) for t in turns if t.has_ids})
    return result, every


def _numbers(values: np.ndarray) -> list[float | None]:
    return [None if np.isnan(v) else float(v) for v in values.tolist()]


def replay_logprobs(store: Store, session_id: str, replay_id: str) -> ReplayLogprobs:
    """Both engines' logprobs of each turn the replay scored. KeyError for an unknown session."""
    _, turns = store.load_session(session_id)
    reference = store.replay_logprobs(replay_id)
    scored: list[ReplayTurnLogprobs] = []
    for turn in turns:
        ref = reference.get(turn.seq)
        if ref is None or turn.logprobs is None or turn.logprobs.shape != ref.shape:
            continue
        scored.append(
            ReplayTurnLogprobs(seq=turn.seq, sampler=_numbers(turn.logprobs), reference=_numbers(ref))
        )
    return ReplayLogprobs(replay_id=replay_id, turns=scored)


def replay_run(store: Store, run_dir: Path, reference: ReferenceEngine) -> RunReplay:
    """Replay every session of a run (its rollouts' capture sessions); sessions with nothing to
    score are listed in `skipped` with why. SessionNotReplayable when no session can be replayed."""
    from tapdeck.runner.run_dir import RESULTS, load_results

    results = load_results(run_dir / RESULTS)
    replays: list[ReplayResult] = []
    skipped: list[str] = []
    pairs: list[TokenPair] = []
    for result in results.values():
        if not result.session_id:
            skipped.append(f"{result.rollout_id}: no capture session")
            continue
        try:
            replay, got = replay_session(store, result.session_id, reference)
        except SessionNotReplayable as exc:
            skipped.append(f"{result.session_id}: {exc.message}")
            continue
        replays.append(replay)
        pairs.extend(got)
    if not replays:
        raise SessionNotReplayable(
            f"run {run_dir.name} has no session to replay ({len(results)} rollout(s)"
            + (f"; {skipped[0]}" if skipped else "")
            + ")"
        )
    return RunReplay(run_id=run_dir.name, replays=replays, run=drift_figures(pairs), skipped=skipped)
