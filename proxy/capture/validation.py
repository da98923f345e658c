"""Validation per turn, per training sequence and per rollout (capture-cases F and K).

Every finding renders as `[FATAL|WARN|INFO] code: detail` (see `tapdeck.schema.findings`).
Any FATAL makes the rollout not ok; a FATAL turn stays linked in the graph, its tokens masked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tapdeck.proxy.capture.graph import _LOGPROB_SLACK, RolloutGraph
from tapdeck.proxy.capture.turn import Turn
from tapdeck.schema.findings import Finding, has_fatal
from tapdeck.schema.rollout_health import DEFAULT_MIN_LOSS_MASK_FRACTION, DEGENERATE, DegenerateReason
from tapdeck.schema.sessions import RolloutStats


def _check_ids(name: str, ids: Any, seq: int) -> list[Finding]:
    arr = np.asarray(ids)
    if arr.size == 0:
        return []
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        return [Finding.fatal("bad_token_id", f"{name} are not integers (dtype {arr.dtype})", seq)]
    if arr.min() < 0:
        at = int(np.flatnonzero(arr < 0)[0])
        return [Finding.fatal("bad_token_id", f"{name}[{at}] = {int(arr[at])} is negative", seq)]
    return []


def validate_turn(turn: Turn, tier: str) -> list[Finding]:
    """Ingest checks on one captured call.

    `tier` is the session's capture tier (`tokens`, `logprobs` or `text`, a str or Tier enum).
    """
    seq = turn.seq
    out: list[Finding] = []
    tokens = str(tier) == "tokens"
    if tokens and turn.prompt_ids is None:
        out.append(
            Finding.fatal(
                "no_prompt_ids",
                "tokens tier but the engine returned no prompt_token_ids; the turn cannot be trained",
                seq,
            )
        )
    if tokens and turn.sampled_ids is None:
        out.append(
            Finding.fatal(
                "no_sampled_ids", "tokens tier but the engine returned no token_ids for the reply", seq
            )
        )
    if turn.prompt_ids is not None:
        out += _check_ids("prompt ids", turn.prompt_ids, seq)
    if turn.sampled_ids is not None:
        out += _check_ids("sampled ids", turn.sampled_ids, seq)
        if len(turn.sampled_ids) == 0:
            out.append(Finding.warn("empty_completion", "the engine sampled no tokens", seq))
        if turn.logprobs is None and str(tier) != "text":
            out.append(Finding.fatal("no_logprobs", "sampled ids without logprobs", seq))
    if turn.logprobs is not None:
        lp = np.asarray(turn.logprobs, dtype=np.float64)
        if turn.sampled_ids is not None and lp.shape != (len(turn.sampled_ids),):
            out.append(
                Finding.fatal(
                    "length_mismatch", f"{lp.size} logprobs for {len(turn.sampled_ids)} sampled ids", seq
                )
            )
        nan = np.isnan(lp)
        if nan.any():
            out.append(
                Finding.warn(
                    "logprob_null",
                    f"{int(nan.sum())} logprobs missing (null), "
                    f"first at {int(np.flatnonzero(nan)[0])}; turn not trainable",
                    seq,
                )
            )
        inf = np.isinf(lp)
        if inf.any():
            out.append(
                Finding.fatal(
                    "logprob_not_finite", f"non-finite logprob at {int(np.flatnonzero(inf)[0])}", seq
                )
            )
        pos = lp > _LOGPROB_SLACK
        if pos.any():
            at = int(np.flatnonzero(pos)[0])
            out.append(Finding.fatal("logprob_positive", f"logprob[{at}] = {lp[at]} > 0", seq))
    if turn.finish_reason == "length":
        out.append(
            Finding.warn(
                "truncated",
                "reply cut by max_tokens (finish_reason length); the "
                "next prompt may add an end token the model never sampled",
                seq,
            )
        )
    return out


def validate_sequence(
    input_ids: Any, loss_mask: Any, logprobs: Any, *, label: str = "", turn: int | None = None
) -> list[Finding]:
    """Checks on one training sequence (sequence coordinates)."""
    where = f"sequence {label}: " if label else ""
    ids, mask, lp = (np.asarray(a) for a in (input_ids, loss_mask, logprobs))
    if not (ids.shape == mask.shape == lp.shape):
        return [
            Finding.fatal(
                "sequence_length_mismatch",
                f"{where}input_ids {ids.shape}, loss_mask {mask.shape}, logprobs {lp.shape}",
                turn,
            )
        ]
    out = []
    lpf = lp.astype(np.float64)
    ctx = (mask == 0) & (lpf != 0)
    if ctx.any():
        out.append(
            Finding.fatal(
                "context_logprob",
                f"{where}position {int(np.flatnonzero(ctx)[0])} has mask 0 but logprob {lpf[ctx][0]}",
                turn,
            )
        )
    on = mask == 1
    if not on.any():
        out.append(Finding.fatal("nothing_trainable", f"{where}no position has loss_mask 1", turn))
    elif not np.isfinite(lpf[on]).all() or (lpf[on] > _LOGPROB_SLACK).any():
        out.append(
            Finding.fatal(
                "bad_trained_logprob", f"{where}a trained position has a non-finite or positive logprob", turn
            )
        )
    return out


def validate_rollout(
    graph: RolloutGraph,
    tier: str,
    *,
    rollout_type: str = "auto",
    min_loss_mask_fraction: float | None = None,
) -> list[Finding]:
    """Rollout-level findings plus the checks of every agent training sequence, and a train
    rollout's health grade (`degenerate_findings`).

    Turn and link findings live on the turns (`graph.findings()`); `rollout_ok` combines both.
    `rollout_type` `auto` means train at the tokens tier, eval otherwise. `min_loss_mask_fraction`
    None is the default threshold (`schema.rollout_health`).
    """
    out: list[Finding] = []
    stats = graph.stats()
    if stats.turns == 0:
        return [Finding.fatal("no_calls", "the harness made no model call through the proxy")]
    # Auxiliary calls (a title, a router) are conversations of their own: only the agent's calls
    # all being roots says its conversation never linked.
    tools = graph.has_tools()
    agent_calls = [seq for seq in graph.nodes if graph.node_role(seq, tools=tools) == "agent"]
    if stats.turns == 1:
        out.append(Finding.warn("single_call", "only one model call in this rollout"))
    elif len(agent_calls) > 1 and all(graph.nodes[seq].parent is None for seq in agent_calls):
        out.append(
            Finding.warn(
                "every_call_a_root",
                f"all {len(agent_calls)} agent calls are roots: "
                "nothing links by token prefix (the harness re-renders its "
                "prompts, or resends a prompt without the reply it got)",
            )
        )
    elif stats.roots > 1:
        out.append(
            Finding.warn(
                "several_roots",
                f"{stats.roots} roots (subagents, title or summary calls, or broken prefixes)",
            )
        )
    if stats.discarded:
        out.append(
            Finding.warn(
                "discarded_turns",
                f"{stats.discarded} discarded turns (retries/resamples that were not continued)",
            )
        )
    if stats.breaks:
        out.append(
            Finding.warn(
                "prefix_breaks",
                f"{stats.breaks} prefix breaks; fragmentation "
                f"{stats.fragmentation} token segments per conversation",
            )
        )
    if is_train(tier, rollout_type):
        agent = [s for s in graph.sequences() if s.role == "agent" and s.input_ids is not None]
        trainable = False
        for i, s in enumerate(agent):
            found = validate_sequence(s.input_ids, s.loss_mask, s.logprobs, label=str(i), turn=s.nodes[-1])
            trainable = trainable or not any(f.code == "nothing_trainable" for f in found)
            out += found
        if not trainable:
            out.append(
                Finding.fatal("no_trainable_sequence", "train rollout without any trainable agent sequence")
            )
        out += degenerate_findings(graph, min_loss_mask_fraction)
    return out


def loss_mask_tokens(graph: RolloutGraph) -> tuple[int, int]:
    """(tokens the agent's calls sampled, those of them in the loss): each call counted once, as
    the training trace has it (its completion tokens and their loss mask)."""
    tools = graph.has_tools()
    sampled = trained = 0
    for seq, node in graph.nodes.items():
        if node.sampled is None or graph.node_role(seq, tools=tools) != "agent":
            continue
        sampled += node.sampled_len
        if graph.node_mask_on(seq, tools=tools):
            trained += node.sampled_len
    return sampled, trained


def degenerate_findings(graph: RolloutGraph, min_loss_mask_fraction: float | None = None) -> list[Finding]:
    """A train rollout's `degenerate` grade, one WARN finding per reason (none: it is healthy).

    Its reasons: a single model call; no sampled token of the agent in the loss; a loss-mask
    fraction (trained / sampled tokens of the agent's calls) below `min_loss_mask_fraction`
    (None: `DEFAULT_MIN_LOSS_MASK_FRACTION`; 0: never)."""
    threshold = DEFAULT_MIN_LOSS_MASK_FRACTION if min_loss_mask_fraction is None else min_loss_mask_fraction
    out = []
    calls = len(graph.nodes)
    if calls == 1:
        out.append(Finding.warn(DEGENERATE, f"{DegenerateReason.SINGLE_CALL}: one model call in the rollout"))
    sampled, trained = loss_mask_tokens(graph)
    if trained == 0:
        out.append(
            Finding.warn(
                DEGENERATE,
                f"{DegenerateReason.NO_TRAINABLE_TOKEN}: none of the agent's {sampled} sampled tokens "
                "is in the loss",
            )
        )
    elif trained / sampled < threshold:
        out.append(
            Finding.warn(
                DEGENERATE,
                f"{DegenerateReason.LOW_LOSS_MASK_FRACTION}: {trained} of the agent's {sampled} sampled "
                f"tokens in the loss ({trained / sampled:.2f}), below the threshold {threshold:g}",
            )
        )
    return out


def is_train(tier: str, rollout_type: str = "auto") -> bool:
    """Train only at the tokens tier, and never when the rollout was declared eval."""
    return str(tier) == "tokens" and str(rollout_type) != "eval"


def reported_stats(stats: RolloutStats, tier: str, rollout_type: str) -> dict[str, Any]:
    """A graph's stats as every view of the rollout reports them: one that is not trained on
    (eval, or below the tokens tier) has no trainable tokens."""
    out = stats.model_dump()
    if not is_train(tier, rollout_type):
        out["trainable_tokens"] = 0
    return out


def rollout_ok(graph: RolloutGraph, findings: list[Finding]) -> bool:
    """No FATAL among the rollout findings nor any turn or link finding."""
    return not has_fatal(findings) and not has_fatal(graph.findings())
