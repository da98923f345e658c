"""data-check computes what TRL computes, checked against TRL 1.16's and OpenEnv 0.10's own code.

The same recorded-vLLM rollouts (tests.support.training_export.ROLLOUTS, through tapdeck's real export) go to
data-check's functions here and to TRL's `_chain_to_sequences`, `_score_group` and OpenEnv's strict
`TrainingTrace` in the training environment (train_env_scripts/trl_reference.py); nothing on the
TRL side is reimplemented.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import orjson
import pytest

from tapdeck.runner.recipes.data_check import (
    TurnRow,
    build_rows,
    check_turn,
    group_advantages,
    load_rollouts,
)
from tests.support.in_train_env import TRAIN_ENV_SCRIPTS, run_in_train_env
from tests.support.training_export import ROLLOUTS, TOOL_CALLS, rollout_trace, tool_call_trace

pytestmark = pytest.mark.slow  # imports torch and TRL in the training environment (tens of seconds)

SCRIPT = TRAIN_ENV_SCRIPTS / "trl_reference.py"
THRESHOLDS = (0, 1024)  # TRL's loop-owning lossless mode, and its default elsewhere


def _trl_view(train_python: Path, tmp_path: Path, rollouts: list[dict]) -> dict:
    spec = tmp_path / "spec.json"
    spec.write_bytes(
        orjson.dumps(
            {"fork_thresholds": list(THRESHOLDS), "rollouts": rollouts}, option=orjson.OPT_SERIALIZE_NUMPY
        )
    )
    return json.loads(run_in_train_env(train_python, SCRIPT, str(spec)))


def _trace_turns(trace: dict) -> dict:
    return {"schema_version": trace["schema_version"], "turns": trace["turns"]}


def _corrupted() -> list[dict]:
    """Real traces with one completion logprob broken on a MASKED turn: OpenEnv refuses both."""
    base = _trace_turns(rollout_trace("ro-b"))
    out = []
    for name, value in (("null-logprob", None), ("positive-logprob", 0.25)):
        trace = copy.deepcopy(base)
        turn = trace["turns"][0]
        turn["loss_mask"] = [0] * len(turn["loss_mask"])
        turn["per_token_logps"][1] = value
        out.append({"rollout_id": name, "group_id": name, "reward": 1.0, "trace": trace})
    return out


def test_data_check_rows_tallies_and_advantages_equal_trls(
    train_python: Path, tmp_path: Path, export_file: Path
) -> None:
    ours = {r.rollout_id: r for r in load_rollouts(export_file)}
    rollouts = [
        {"rollout_id": rid, "group_id": group, "reward": reward, "trace": _trace_turns(rollout_trace(rid))}
        for rid, (group, reward, _) in ROLLOUTS.items()
    ]
    rollouts += _corrupted()
    rollouts.append(
        {"rollout_id": "tools", "group_id": "tools", "reward": 1.0, "trace": _trace_turns(tool_call_trace())}
    )
    trl = _trl_view(train_python, tmp_path, rollouts)
    # TRL counts tool calls from each turn's chat-completion response: all of tapdeck's, by name.
    tools = trl["0"]["rollouts"][-1]
    assert tools["valid"] and tools["tool_counts"] == {"shell": 2, "write_file": 1} and len(TOOL_CALLS) == 3

    for threshold in THRESHOLDS:
        view = trl[str(threshold)]
        by_id = {r["rollout_id"]: r for r in view["rollouts"]}
        # Every completion logprob is checked, as OpenEnv checks it: same verdict on every rollout.
        for r in rollouts:
            turns = [
                TurnRow(
                    t["node_id"],
                    t["prompt_token_ids"],
                    t["completion_token_ids"],
                    t["per_token_logps"],
                    t["loss_mask"],
                )
                for t in r["trace"]["turns"]
            ]
            findings = [f for t in turns for f in check_turn(t)]
            assert by_id[r["rollout_id"]]["valid"] == (not findings), (
                r["rollout_id"],
                findings,
                by_id[r["rollout_id"]].get("error"),
            )
        assert not by_id["null-logprob"]["valid"] and not by_id["positive-logprob"]["valid"]

        for rid, rollout in ours.items():
            rows, tally = build_rows(rollout.turns, fork_threshold=threshold)
            ref = by_id[rid]
            assert len(rows) == len(ref["sequences"]), (threshold, rid)
            for row, seq in zip(rows, ref["sequences"], strict=True):
                assert row.input_ids.tolist() == seq["input_ids"]
                assert row.completion_mask.tolist() == seq["completion_mask"]
                assert row.old_log_probs.tolist() == pytest.approx(seq["old_log_probs"], abs=1e-6)
            # Per transition (turns − 1 of them), as TRL's fork_frac / realign_frac count.
            assert (tally.clean, tally.realign, tally.fork, tally.transitions) == (
                ref["tally"]["clean"],
                ref["tally"]["realign"],
                ref["tally"]["fork"],
                ref["tally"]["transitions"],
            )
            assert (tally.drift_tokens, tally.drift_max) == (
                ref["tally"]["drift_tokens"],
                ref["tally"]["drift_max"],
            )

        # Advantages and reward std per group, population std, null rewards excluded.
        for gid in {g for g, _, _ in ROLLOUTS.values()}:
            members = sorted(
                (r for r in ours.values() if r.group_id == gid),
                key=lambda r: list(ROLLOUTS).index(r.rollout_id),
            )
            expected = group_advantages([r.reward for r in members])
            samples = iter(view["groups"].get(gid, []))
            scored = [r.reward for r in members if r.reward is not None]
            for r, advantage in zip(members, expected, strict=True):
                for _ in build_rows(r.turns, fork_threshold=threshold)[0]:
                    sample = next(samples)
                    assert sample["advantage"] == pytest.approx(
                        0.0 if advantage is None else advantage, abs=1e-9
                    )
                    if scored:
                        assert sample["reward_std"] == pytest.approx(float(np.std(scored)), abs=1e-12)
            assert next(samples, None) is None

    # The fixtures exercise what the counts are about: a retokenised pair forks at 0 and realigns at 1024.
    assert trl["0"]["rollouts"][list(ROLLOUTS).index("ro-e")]["tally"]["fork"] == 1
    assert trl["1024"]["rollouts"][list(ROLLOUTS).index("ro-e")]["tally"]["realign"] == 1
