"""Run in the training environment: what TRL 1.16's and OpenEnv 0.10's own code make of tapdeck traces.

Reads a JSON file `{"fork_thresholds": [N, ...], "rollouts": [{"rollout_id", "group_id", "reward",
"trace"}]}` and writes, as JSON on stdout, for each fork threshold (as a string key), per rollout:
whether OpenEnv's strict `TrainingTrace` accepts the trace (and the error), the `TurnRecord`s TRL
reads from it, TRL's tool counts and transcript, and the rows and drift tally of TRL's
`_chain_to_sequences`; per group: the samples of TRL's `_score_group` (advantage, reward,
reward_std, row arrays). `_score_group` is TRL's unbound method called on a minimal loop
state: no reward functions, the harness's reward column only, as in loop-owning mode.
"""

from __future__ import annotations

import asyncio
import json
import sys
from types import SimpleNamespace

from accelerate.state import PartialState
from openenv.core.harness import TrainingTrace
from trl.experimental.async_grpo.async_rollout_worker import (
    RolloutGroup,
    _AsyncRolloutLoop,
    _chain_to_sequences,
)
from trl.experimental.async_grpo.openenv_harness import (
    _messages_from_trace,
    _tool_call_counts_by_name,
    _turns_from_training_trace,
)


def reference(spec: dict, threshold: int) -> dict:
    """TRL's view of every rollout and group at one `fork_threshold_tokens`."""
    out_rollouts = []
    groups: dict[str, list[tuple[dict, list, float | None]]] = {}
    for r in spec["rollouts"]:
        doc = {"rollout_id": r["rollout_id"], "group_id": r["group_id"]}
        try:
            trace = TrainingTrace.model_validate(r["trace"])
        except ValueError as exc:
            doc["valid"], doc["error"] = False, str(exc)
            out_rollouts.append(doc)
            continue
        turns = _turns_from_training_trace(trace)
        entries = trace.to_trace_entries()
        sequences, tally = _chain_to_sequences(turns, r["rollout_id"], threshold)
        doc.update(
            valid=True,
            tool_counts=_tool_call_counts_by_name(entries),
            transcript=_messages_from_trace(entries),
            turns=[
                {
                    "prompt_ids": t.prompt_ids,
                    "output_ids": t.output_ids,
                    "output_log_probs": t.output_log_probs,
                    "output_mask": t.output_mask,
                }
                for t in turns
            ],
            sequences=[
                {
                    "input_ids": s.input_ids,
                    "completion_mask": s.completion_mask,
                    "old_log_probs": s.old_log_probs,
                }
                for s in sequences
            ],
            tally=tally,
        )
        out_rollouts.append(doc)
        groups.setdefault(r["group_id"], []).append((doc, sequences, r["reward"]))

    state = SimpleNamespace(
        reward_funcs=[],
        _env_reward_types=[],
        _provides_rollout_reward=True,
        reward_func_names=["harness_reward"],
    )
    out_groups = {}
    for gid, members in groups.items():
        group = RolloutGroup(
            prompts=[[] for _ in members],
            reward_kwargs={},
            completions=[[] for _ in members],
            completions_ids=[[] for _ in members],
            completions_sequences=[seqs for _, seqs, _ in members],
            tool_call_counts=[0 for _ in members],
            tool_failure_counts=[0 for _ in members],
            model_version=0,
            group_id=0,
            env_rewards=[],
            rollout_rewards=[reward for _, _, reward in members],
        )
        samples = asyncio.run(_AsyncRolloutLoop._score_group(state, group))
        out_groups[gid] = [
            {
                "advantage": s.advantage,
                "reward": s.metrics["reward"],
                "reward_std": s.metrics["reward_std"],
                "input_ids": s.input_ids.tolist(),
                "completion_mask": s.completion_mask.tolist(),
                "old_log_probs": s.old_log_probs.tolist(),
            }
            for s in samples
        ]
    return {"rollouts": out_rollouts, "groups": out_groups}


def main(path: str) -> None:
    PartialState()  # TRL's worker child does this first: accelerate's logger needs it
    spec = json.loads(open(path).read())
    json.dump({str(n): reference(spec, int(n)) for n in spec["fork_thresholds"]}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
