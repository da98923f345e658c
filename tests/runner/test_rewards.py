"""The reward rule, one test per capture-cases J item (64-66)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tapdeck.runner.rewards import (
    REWARD_AMBIGUOUS,
    REWARD_KEY_MISSING,
    choose_reward,
    coerce_rewards,
    read_reward_files,
)
from tapdeck.schema.findings import Level


def test_single_key_is_the_reward_whatever_its_name() -> None:
    choice = choose_reward({"accuracy": 0.75})
    assert choice.reward == 0.75 and choice.key == "accuracy" and choice.error_kind is None


def test_named_reward_key_wins_over_reward() -> None:
    choice = choose_reward({"reward": 1.0, "f1": 0.25}, reward_key="f1")
    assert choice.reward == 0.25 and choice.key == "f1"


def test_named_reward_key_missing_is_an_error_listing_the_keys() -> None:
    choice = choose_reward({"reward": 1.0, "f1": 0.25}, reward_key="acc")
    assert choice.reward is None
    assert choice.error_kind == REWARD_KEY_MISSING
    assert "f1" in choice.error and "reward" in choice.error and "'acc'" in choice.error


def test_several_keys_including_reward_take_reward() -> None:
    choice = choose_reward({"reward": 0.5, "tests_passed": 3, "tests_total": 4})
    assert choice.reward == 0.5 and choice.key == "reward"
    assert choice.rewards == {"reward": 0.5, "tests_passed": 3.0, "tests_total": 4.0}


def test_several_keys_without_reward_are_refused_with_the_keys_listed() -> None:
    choice = choose_reward({"pass": 1.0, "style": 0.2})
    assert choice.reward is None
    assert choice.error_kind == REWARD_AMBIGUOUS
    assert "pass" in choice.error and "style" in choice.error and "--reward-key" in choice.error
    assert any(f.level is Level.FATAL for f in choice.findings)


@pytest.mark.parametrize("bad", [None, "N/A", {"nested": 1}, math.nan, math.inf, -math.inf, [1.0], True])
def test_each_bad_value_is_dropped_alone_with_a_warn(bad: object) -> None:
    choice = choose_reward({"reward": 1.0, "extra": bad})
    assert choice.reward == 1.0
    assert "extra" not in choice.rewards
    dropped = [f for f in choice.findings if f.code == "reward_value_dropped"]
    assert len(dropped) == 1 and dropped[0].level is Level.WARN and "'extra'" in dropped[0].detail


def test_numeric_text_is_coerced() -> None:
    rewards, findings = coerce_rewards({"reward": " 0.5\n", "n": 2})
    assert rewards == {"reward": 0.5, "n": 2.0} and findings == []


def test_bad_values_do_not_make_the_surviving_key_ambiguous() -> None:
    choice = choose_reward({"score": 1.0, "detail": "N/A"})
    assert choice.reward == 1.0 and choice.key == "score"


def test_chosen_key_with_a_bad_value_is_null_not_zero() -> None:
    choice = choose_reward({"reward": math.nan, "aux": 1.0})
    assert choice.reward is None and choice.key == "reward"


def test_verifier_never_ran_gives_null_and_a_finding_never_zero() -> None:
    choice = choose_reward(None)
    assert choice.reward is None and choice.error_kind is None
    assert [f.code for f in choice.findings] == ["reward_missing"]


def test_empty_rewards_give_null_and_a_finding() -> None:
    choice = choose_reward({})
    assert choice.reward is None
    assert any(f.code == "reward_missing" for f in choice.findings)


def test_reward_json_with_one_bad_value_is_read_leniently(tmp_path: Path) -> None:
    # Harbor refuses this whole file (VerifierOutputParseError); the rule keeps the good key.
    (tmp_path / "reward.json").write_text('{"reward": 1, "note": "N/A", "x": NaN}')
    raw, findings = read_reward_files(tmp_path)
    assert findings == []
    choice = choose_reward(raw)
    assert choice.reward == 1.0 and set(choice.rewards) == {"reward"}


def test_reward_json_beats_reward_txt(tmp_path: Path) -> None:
    (tmp_path / "reward.json").write_text(json.dumps({"reward": 0.25}))
    (tmp_path / "reward.txt").write_text("1")
    raw, _ = read_reward_files(tmp_path)
    assert choose_reward(raw).reward == 0.25


def test_garbage_reward_txt_gives_null_with_findings(tmp_path: Path) -> None:
    (tmp_path / "reward.txt").write_text("all good!\n")
    raw, _ = read_reward_files(tmp_path)
    choice = choose_reward(raw)
    assert choice.reward is None
    assert {f.code for f in choice.findings} == {"reward_value_dropped", "reward_missing"}


def test_no_reward_files_reads_as_none(tmp_path: Path) -> None:
    assert read_reward_files(tmp_path) == (None, [])
