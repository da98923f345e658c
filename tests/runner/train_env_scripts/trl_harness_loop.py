"""Run in the training environment: TRL's loop-owning rollout loop over a real tapdeck server.

`HarnessRolloutWorker` is built with exactly grpo-trl's `worker_kwargs(...)`; its constructor only
checks that vllm imports (it never uses it in loop-owning mode), so that check is patched and
nothing else. Its forwarded kwargs (`worker._loop_kwargs`, pickled as `start()` pickles them) then
build TRL's `_HarnessRolloutLoop` in this process with the worker's own queues, as the worker's
spawned child would, and `run()` drives it on a thread until `groups` groups are scored; the vLLM
URL points at a closed port, so any generation request would fail.

Usage: trl_harness_loop.py SERVER ADMIN_KEY TOKENIZER_GGUF OUT_JSON GROUPS TASK...
Writes the samples TRL built and the metrics it pushed as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import queue
import sys
import threading
import time
from pathlib import Path
from unittest import mock

from accelerate.state import PartialState
from trl.chat_template_utils import qwen3_template
from trl.experimental.async_grpo import async_rollout_worker
from trl.experimental.async_grpo.openenv_harness import _HarnessRolloutLoop

from tapdeck.runner.recipes import grpo_trl

CLOSED_PORT_URL = "http://127.0.0.1:9"  # the discard port: nothing listens there
DEADLINE_S = 1500


def main(server: str, admin_key: str, gguf: str, out: str, groups: str, *tasks: str) -> None:
    PartialState()  # as the worker's child does before building the loop
    stack = grpo_trl.training_stack()
    args = grpo_trl.arg_parser().parse_args(
        [
            "--server",
            server,
            "--admin-key",
            admin_key,
            "--vllm-url",
            CLOSED_PORT_URL,
            "--engine-url",
            "embedded",
            "--model",
            "smollm2",
            "--num-generations",
            "2",
            "--max-inflight",
            "1",
            "--temperature",
            "0.8",
            "--timeout-s",
            "600",
            "--call-budget",
            "2",
            "--tasks",
            *tasks,
        ]
    )
    run_name, output_dir = grpo_trl.launch_names(None, Path(out).parent / "grpo-out")
    # bf16 is a GPU setting TrainingArguments refuses on a CPU box; nothing else differs from the recipe.
    config = stack.AsyncGRPOConfig(
        **grpo_trl.config_kwargs(args, run_name=run_name, output_dir=output_dir), bf16=False
    )
    tokenizer = stack.AutoTokenizer.from_pretrained(str(Path(gguf).parent), gguf_file=Path(gguf).name)
    # TRL's loop insists on a reply parser for the tokenizer and knows no SmolLM2 one. Loop-owning mode
    # never parses a reply (the harness does): Qwen's, of the same ChatML family, stands in.
    tokenizer.response_template = qwen3_template
    factory = dataclasses.replace(
        grpo_trl.factory_from_args(args),
        poll_s=0.5,
        # Two calls: a one-call rollout is graded degenerate, and grpo-trl skips it.
        agent_kwargs={"max_turns": 2, "llm_kwargs": {"max_tokens": 32}},
    )
    kwargs = grpo_trl.worker_kwargs(
        config,
        model_name=args.model,
        dataset=stack.Dataset.from_list(grpo_trl.dataset_rows(list(tasks))),
        processing_class=tokenizer,
        eos_ids=grpo_trl.eos_token_ids(None, tokenizer.eos_token_id),
        factory=factory,
    )
    with mock.patch.object(async_rollout_worker, "is_vllm_available", return_value=True):
        worker = stack.HarnessRolloutWorker(**kwargs)
    pickle.loads(pickle.dumps(worker._loop_kwargs))  # what start() checks before spawning
    loop = _HarnessRolloutLoop(
        **worker._loop_kwargs,
        rollout_buffer=worker.rollout_buffer,
        model_version_value=worker._model_version_value,
        heartbeat_value=worker._heartbeat_value,
        failed_event=worker._failed_event,
        exception_info_queue=worker._exception_info_queue,
        metrics_queue=worker.metrics_queue,
    )
    thread = threading.Thread(target=loop.run, name="trl-rollout-loop")
    thread.start()

    samples, metrics, scored = [], [], 0
    deadline = time.monotonic() + DEADLINE_S
    try:
        while scored < int(groups):
            if worker._failed_event.is_set() or not thread.is_alive():
                raise SystemExit(f"TRL's rollout loop stopped: {worker._exception_info_queue.get(timeout=5)}")
            if time.monotonic() > deadline:
                raise SystemExit(f"only {scored} group(s) scored in {DEADLINE_S} s")
            try:
                payload = worker.metrics_queue.get(timeout=0.5)
            except queue.Empty:
                continue
            metrics.append(payload)
            scored += "rollout/score_s" in payload
        time.sleep(1.0)  # the score loop pushes a group's samples right after its metrics
        while True:
            try:
                s = worker.rollout_buffer.get(timeout=2.0)
            except queue.Empty:
                break
            samples.append(
                {
                    "group_id": s.group_id,
                    "input_ids": s.input_ids.tolist(),
                    "completion_mask": s.completion_mask.tolist(),
                    "old_log_probs": s.old_log_probs.tolist(),
                    "advantage": s.advantage,
                    "metrics": s.metrics,
                    "completion": s.completion,
                }
            )
    finally:
        loop._loop.call_soon_threadsafe(loop._stop_event.set)
        thread.join(timeout=120)
    Path(out).write_text(
        json.dumps(
            {
                "samples": samples,
                "metrics": metrics,
                "loop_kwargs": sorted(worker._loop_kwargs),
                "sampling": loop._factory.sampling,
                "fork_threshold": loop._fork_threshold_tokens,
                "vllm_server_url": loop.vllm_server_url,
                "loop_stopped": not thread.is_alive(),
                "failed": worker._failed_event.is_set(),
            },
            default=float,
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
