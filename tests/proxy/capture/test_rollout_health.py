"""The `degenerate` grade of a train rollout (`schema.rollout_health`): each of its reasons, the
loss-mask fraction's threshold at its boundary, and where the threshold comes from."""

from __future__ import annotations

import dataclasses

import pytest

from tapdeck.proxy.capture.export import rollout_document
from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.capture.validation import loss_mask_tokens, validate_rollout
from tapdeck.schema.findings import Finding, Level
from tapdeck.schema.rollout_health import (
    DEFAULT_MIN_LOSS_MASK_FRACTION,
    DEGENERATE,
    DegenerateReason,
    degenerate_reasons,
    loss_mask_fraction,
)
from tests.support.recorded_turns import turn_from_fixture

SAMPLED = (16, 13, 12)
"""Tokens the three recorded chat turns sampled (one conversation, each call extending the last)."""


def chat(*untrainable: int) -> RolloutGraph:
    """The recorded three-call chat, the calls `untrainable` without logprobs (masked out)."""
    g = RolloutGraph()
    for i in range(3):
        turn = turn_from_fixture(f"chat_multiturn_{i + 1}", i)
        assert len(turn.sampled_ids) == SAMPLED[i]
        g.add(dataclasses.replace(turn, logprobs=None) if i in untrainable else turn)
    return g


def graded(graph: RolloutGraph, **kwargs) -> list[DegenerateReason]:
    found = validate_rollout(graph, "tokens", **kwargs)
    assert all(f.level is Level.WARN for f in found if f.code == DEGENERATE)
    return degenerate_reasons(found)


def test_a_healthy_multi_call_rollout_is_not_degenerate() -> None:
    g = chat()
    assert loss_mask_tokens(g) == (41, 41)
    assert graded(g) == []


def test_a_single_call_rollout_is_degenerate_with_that_reason() -> None:
    g = RolloutGraph()
    g.add(turn_from_fixture("chat_basic", 0))
    [finding] = [f for f in validate_rollout(g, "tokens") if f.code == DEGENERATE]
    assert str(finding) == "[WARN] degenerate: single_call: one model call in the rollout"
    assert degenerate_reasons([finding]) == [DegenerateReason.SINGLE_CALL]


def test_a_rollout_with_no_trainable_token_is_degenerate_not_also_low_fraction() -> None:
    g = chat(0, 1, 2)
    assert loss_mask_tokens(g) == (41, 0)
    assert graded(g) == [DegenerateReason.NO_TRAINABLE_TOKEN]
    # The threshold off does not make it healthy: nothing is trainable at all.
    assert graded(g, min_loss_mask_fraction=0.0) == [DegenerateReason.NO_TRAINABLE_TOKEN]


def test_a_low_loss_mask_fraction_is_degenerate_below_the_threshold_only() -> None:
    g = chat(0, 1)  # 12 of 41 sampled tokens trainable: 0.29
    assert loss_mask_tokens(g) == (41, 12)
    found = validate_rollout(g, "tokens")
    assert degenerate_reasons(found) == [DegenerateReason.LOW_LOSS_MASK_FRACTION]
    detail = next(f.detail for f in found if f.code == DEGENERATE)
    assert detail == (
        "low_loss_mask_fraction: 12 of the agent's 41 sampled tokens in the loss (0.29), "
        f"below the threshold {DEFAULT_MIN_LOSS_MASK_FRACTION:g}"
    )
    one_masked = chat(1)  # 28 of 41: 0.68, above the default
    assert graded(one_masked) == []
    # At the threshold exactly it is healthy; just above the fraction, degenerate.
    assert graded(one_masked, min_loss_mask_fraction=28 / 41) == []
    assert graded(one_masked, min_loss_mask_fraction=28 / 41 + 1e-9) == [
        DegenerateReason.LOW_LOSS_MASK_FRACTION
    ]
    assert graded(g, min_loss_mask_fraction=0.0) == []  # 0: no fraction check


def test_eval_rollouts_are_not_graded() -> None:
    g = RolloutGraph()
    g.add(turn_from_fixture("chat_basic", 0))
    assert degenerate_reasons(validate_rollout(g, "tokens", rollout_type="eval")) == []
    assert degenerate_reasons(validate_rollout(chat(0, 1, 2), "logprobs")) == []


def test_the_rollout_document_grades_with_the_sessions_own_threshold() -> None:
    g = chat(1)  # 0.68
    record = {"id": "s-1", "tier": "tokens", "rollout_type": "train"}
    assert degenerate_reasons(rollout_document(record, g, "tokens")["findings"]) == []
    strict = rollout_document(record | {"min_loss_mask_fraction": 0.9}, g, "tokens")
    assert degenerate_reasons(strict["findings"]) == [DegenerateReason.LOW_LOSS_MASK_FRACTION]
    assert strict["ok"]  # a WARN grade: trainers skip it, the rollout itself did not fail


def test_reasons_are_read_from_findings_or_their_json_and_nothing_else() -> None:
    findings = [
        Finding.warn(DEGENERATE, "single_call: one model call in the rollout"),
        Finding.warn("single_call", "only one model call in this rollout"),
        Finding.warn(DEGENERATE, "something_new: a reason this client does not know"),
    ]
    as_json = [f.model_dump(mode="json") for f in findings]
    assert degenerate_reasons(findings) == degenerate_reasons(as_json) == [DegenerateReason.SINGLE_CALL]


def test_the_threshold_is_a_fraction() -> None:
    assert loss_mask_fraction("0.25") == 0.25 and loss_mask_fraction(1) == 1.0
    for bad in ("1.5", "-0.1", "nan", "half"):
        with pytest.raises(ValueError):
            loss_mask_fraction(bad)
