"""Ingest, sequence and rollout validation (capture-cases F and K)."""

from __future__ import annotations

import dataclasses

import numpy as np

from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.capture.tokens import as_logprobs
from tapdeck.proxy.capture.validation import (
    rollout_ok,
    validate_rollout,
    validate_sequence,
    validate_turn,
)
from tapdeck.schema.findings import Finding, Level
from tests.support.recorded_turns import turn_from_fixture


def codes(findings, level=None):
    return {f.code for f in findings if level is None or f.level is level}


def base():
    return turn_from_fixture("chat_basic", 0)


def test_recorded_stop_turn_has_no_findings():
    assert validate_turn(base(), "tokens") == []


def test_findings_render_with_bracketed_level():
    [f] = validate_turn(dataclasses.replace(base(), finish_reason="length"), "tokens")
    assert str(f).startswith("[WARN] truncated: ")


def test_negative_id_is_fatal():
    t = base()
    t.sampled_ids = t.sampled_ids.copy()
    t.sampled_ids[2] = -1
    assert "bad_token_id" in codes(validate_turn(t, "tokens"), Level.FATAL)


def test_non_integer_ids_are_fatal():
    t = dataclasses.replace(base(), prompt_ids=base().prompt_ids.astype(np.float64))
    assert "bad_token_id" in codes(validate_turn(t, "tokens"), Level.FATAL)


def test_non_finite_and_positive_logprobs_are_fatal():
    t = base()
    lp = t.logprobs.copy()
    lp[0] = -np.inf
    lp[1] = 0.5
    found = validate_turn(dataclasses.replace(t, logprobs=lp), "tokens")
    assert {"logprob_not_finite", "logprob_positive"} <= codes(found, Level.FATAL)


def test_logprob_length_mismatch_is_fatal():
    t = base()
    found = validate_turn(dataclasses.replace(t, logprobs=t.logprobs[:-1]), "tokens")
    assert "length_mismatch" in codes(found, Level.FATAL)


def test_null_inside_logprobs_makes_turn_untrainable_without_crashing():
    t = base()
    raw = t.logprobs.tolist()
    raw[3] = None
    t = dataclasses.replace(t, logprobs=as_logprobs(raw))
    assert "logprob_null" in codes(validate_turn(t, "tokens"))
    g = RolloutGraph()
    g.add(t)
    assert not g.nodes[0].trainable and g.stats().trainable_tokens == 0


def test_tokens_tier_without_prompt_ids_or_logprobs_is_fatal():
    t = base()
    assert "no_prompt_ids" in codes(
        validate_turn(dataclasses.replace(t, prompt_ids=None), "tokens"), Level.FATAL
    )
    assert "no_logprobs" in codes(validate_turn(dataclasses.replace(t, logprobs=None), "tokens"), Level.FATAL)
    assert validate_turn(dataclasses.replace(t, prompt_ids=None, sampled_ids=None), "text") == []


def test_zero_sampled_ids_and_length_finish_warn():
    t = dataclasses.replace(
        base(), sampled_ids=np.zeros(0, np.int32), logprobs=np.zeros(0), finish_reason="length"
    )
    found = validate_turn(t, "tokens")
    assert {"empty_completion", "truncated"} <= codes(found, Level.WARN)


def test_fatal_turn_stays_linked_with_tokens_masked_as_context():
    turns = [turn_from_fixture(f"chat_multiturn_{i + 1}", i) for i in range(3)]
    bad = turns[1]
    bad.findings = [Finding.fatal("bad_token_id", "test", 1)]
    g = RolloutGraph()
    for t in turns:
        g.add(t)
    assert g.nodes[2].parent == 1
    [seq] = g.sequences()
    s, e = g.nodes[1].prompt_len, g.nodes[1].full_len
    assert seq.loss_mask[s:e].sum() == 0 and seq.logprobs[s:e].sum() == 0
    assert seq.loss_mask.sum() == len(turns[0].sampled_ids) + len(turns[2].sampled_ids)


def test_sequence_checks_are_fatal():
    ids, mask, lp = np.arange(5), np.array([0, 0, 1, 1, 0]), np.array([0, 0, -1.0, -2.0, 0])
    assert validate_sequence(ids, mask, lp) == []
    assert "context_logprob" in codes(validate_sequence(ids, mask, lp + 0.1 * (mask == 0) * -1))
    assert "nothing_trainable" in codes(validate_sequence(ids, np.zeros(5), np.zeros(5)))
    assert "sequence_length_mismatch" in codes(validate_sequence(ids, mask[:4], lp))


def test_rollout_without_calls_is_fatal_and_not_ok():
    g = RolloutGraph()
    found = validate_rollout(g, "tokens")
    assert codes(found, Level.FATAL) == {"no_calls"} and not rollout_ok(g, found)


def test_rollout_shape_warnings():
    one = RolloutGraph()
    one.add(base())
    assert "single_call" in codes(validate_rollout(one, "tokens"), Level.WARN)
    roots = RolloutGraph()
    roots.add(base())
    roots.add(turn_from_fixture("chat_multiturn_1", 1))
    assert "every_call_a_root" in codes(validate_rollout(roots, "tokens"), Level.WARN)
    roots.add(turn_from_fixture("chat_multiturn_2", 2))
    assert "several_roots" in codes(validate_rollout(roots, "tokens"), Level.WARN)


def test_a_title_call_beside_one_agent_call_is_not_every_call_a_root():
    # opencode's shape: a title call without tools, then one agent call with them. Two
    # conversations, each a root; nothing failed to link.
    g = RolloutGraph()
    g.add(turn_from_fixture("chat_basic", 0))
    g.add(turn_from_fixture("chat_tools_call", 1))
    found = codes(validate_rollout(g, "tokens"), Level.WARN)
    assert "every_call_a_root" not in found and "several_roots" in found


def test_discarded_turns_warn():
    turns = [turn_from_fixture(f"chat_multiturn_{i + 1}", i) for i in range(3)]
    retry = dataclasses.replace(
        turns[1], seq=3, sampled_ids=np.array([504, 2], np.int32), logprobs=np.array([-0.1, -0.2])
    )
    g = RolloutGraph()
    for t in turns + [retry]:
        g.add(t)
    assert "discarded_turns" in codes(validate_rollout(g, "tokens"), Level.WARN)


def test_train_rollout_without_trainable_sequence_is_not_ok():
    g = RolloutGraph()
    g.add(dataclasses.replace(base(), logprobs=None))
    found = validate_rollout(g, "tokens")
    assert "no_trainable_sequence" in codes(found, Level.FATAL) and not rollout_ok(g, found)
    assert rollout_ok(g, validate_rollout(g, "tokens", rollout_type="eval"))


def test_turn_fatal_makes_rollout_not_ok():
    t = base()
    t.findings = [Finding.fatal("logprob_positive", "x", 0)]
    g = RolloutGraph()
    g.add(t)
    g.add(turn_from_fixture("chat_multiturn_1", 1))
    assert not rollout_ok(g, validate_rollout(g, "tokens", rollout_type="eval"))
