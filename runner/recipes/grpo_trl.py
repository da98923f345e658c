"""`grpo-trl`: TRL AsyncGRPO on a GPU box, with rollouts served by a tapdeck server.

**Not run here.** This machine has no GPU, no torch and no trl; the training step itself (the
`main()` path below the argument parsing) has never been executed in this project. What was
tested here: this module imports without trl/torch/openenv, its argument parsing, the printed vLLM
command, pickling of the session factory, and the factory's HTTP logic against a real tapdeck
server (`tests/training/test_grpo_trl.py`). The TRL names used in `main()` (module paths, config
fields) come from reading trl 1.16.0's wheel (shared/reference/trl-and-trackio.md) and are
unverified by execution.

How it fits TRL 1.16's loop-owning harness path: `HarnessRolloutWorker(harness_session_factory=F)`
calls `F(sampling=<dict>)` once in its worker process, then per rollout, on a thread pool,
`create(task, seed=group_id, episode_id=...)` → a session on which it calls
`wait_for_completion()`, `fetch_training_trace()`, `verify(transcript)` and always `close()`.
Here one session = one tapdeck run of one rollout (`POST /admin/runs` with k=1): the server runs
the Harbor trial with the harness pointed at its capture proxy, and the trace is the capture
(`GET /admin/sessions/{id}/trace`). Errors TRL would treat as a broken capture contract
(ValueError/TypeError/KeyError → the worker stops) are never raised for a bad rollout: a rollout
without a usable capture raises `RolloutUnusable` (a RuntimeError) and TRL scores it unscorable.

Launch (2 GPUs, one host): start vLLM first with the flags from `--print-vllm-command`, then
`tapdeck serve --engine-url http://localhost:8000/v1`, then
`CUDA_VISIBLE_DEVICES=1 tapdeck train --recipe grpo-trl -- --server http://127.0.0.1:8300 ...`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tapdeck.runner.recipes.data_check import TurnRow, check_turn

NEUTRAL_SAMPLING = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0,
                    "presence_penalty": 0.0, "repetition_penalty": 1.0}
TERMINAL_RUN_STATES = {"finished", "cancelled", "failed", "interrupted"}


class RolloutUnusable(RuntimeError):
    """The rollout produced no trainable capture (engine down, eval tier, FATAL findings, no calls).

    A RuntimeError on purpose: TRL turns it into an unscorable rollout instead of stopping training.
    """


def vllm_command(model: str, *, port: int = 8000, gpu: str = "0", extra: list[str] | None = None) -> list[str]:
    """The vLLM server command line TRL's NCCL weight sync and tapdeck's capture both need."""
    return ["env", f"CUDA_VISIBLE_DEVICES={gpu}", "VLLM_SERVER_DEV_MODE=1",
            "vllm", "serve", model, "--host", "0.0.0.0", "--port", str(port),
            "--logprobs-mode", "processed_logprobs", "--return-tokens-as-token-ids",
            "--weight-transfer-config", '{"backend":"nccl"}', "--enable-auto-tool-choice",
            *(extra or [])]


@dataclass
class Verified:
    """What `verify()` returns when OpenEnv's VerifyResult is not importable (same fields)."""

    env_reward: float | None
    done: bool = True
    metrics: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)


def fetch_trace(http: httpx.Client, session_id: str) -> dict[str, Any]:
    """A capture session's training trace, checked against TRL's contract before TRL sees it."""
    resp = http.get(f"/admin/sessions/{session_id}/trace")
    if resp.status_code in (404, 409, 422):
        raise RolloutUnusable(f"session {session_id}: no training trace ({resp.status_code}: "
                              f"{resp.text[:200]})")
    resp.raise_for_status()
    trace = resp.json()
    turns = trace.get("turns") or []
    if not turns:
        raise RolloutUnusable(f"session {session_id}: the trace has no agent turn")
    problems = []
    for t in turns:
        problems += check_turn(TurnRow(t.get("node_id"), t.get("prompt_token_ids"),
                                       t.get("completion_token_ids"), t.get("per_token_logps"),
                                       t.get("loss_mask")))
        # OpenEnv wants unique non-empty string node ids; tapdeck's are arrival indexes.
        t["node_id"] = str(t.get("node_id"))
    if problems:
        raise RolloutUnusable(f"session {session_id}: {'; '.join(problems[:3])}")
    if not any(any(t["loss_mask"]) for t in turns):
        raise RolloutUnusable(f"session {session_id}: no trained token in any turn")
    return trace


class TapdeckSession:
    """One rollout on a tapdeck server, shaped like OpenEnv's TrainableSession."""

    def __init__(self, factory: TapdeckSessionFactory, task: str, *, seed: int | None,
                 episode_id: str | None) -> None:
        self.factory = factory
        self.task = task
        self.seed = seed
        self.episode_id = episode_id
        self.http = factory.client()
        self.result: dict[str, Any] | None = None
        resp = self.http.post("/admin/runs", json=factory.plan(task))
        if resp.status_code >= 400:
            self.http.close()
            raise RolloutUnusable(f"tapdeck refused the run for task {task!r}: "
                                  f"{resp.status_code} {resp.text[:300]}")
        self.run_id: str = resp.json()["id"]

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        """Block until the run ends; the number of captured model calls. TimeoutError past `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            doc = self.http.get(f"/admin/runs/{self.run_id}")
            doc.raise_for_status()
            run = doc.json()
            if run["state"] in TERMINAL_RUN_STATES:
                rollouts = run.get("rollouts") or []
                self.result = rollouts[0] if rollouts else {"ok": False, "reward": None,
                                                            "error": f"run ended {run['state']}"}
                return int(self.result.get("turns") or 0)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"tapdeck run {self.run_id} still running after {timeout_s} s")
            time.sleep(self.factory.poll_s)

    def fetch_training_trace(self) -> Any:
        """The capture as OpenEnv's TrainingTrace (a checked dict when OpenEnv is not installed)."""
        if self.result is None:
            self.wait_for_completion()
        assert self.result is not None
        session_id = self.result.get("session_id")
        if not session_id:
            raise RolloutUnusable(f"run {self.run_id}: no capture session "
                                  f"({self.result.get('error_kind') or 'no model calls'}: "
                                  f"{self.result.get('error') or 'nothing to train on'})")
        trace = fetch_trace(self.http, session_id)
        try:
            # Unverified path; present with TRL on a GPU box.
            from openenv.core.harness import TrainingTrace
        except ImportError:
            return trace
        return TrainingTrace.model_validate({k: trace[k] for k in ("schema_version", "turns")})

    def verify(self, transcript: Any = None) -> Any:
        """The rollout's reward from tapdeck's verifier (None = never graded, never 0)."""
        if self.result is None:
            self.wait_for_completion()
        assert self.result is not None
        reward = self.result.get("reward")
        metrics = {"tapdeck/ok": float(bool(self.result.get("ok"))),
                   "tapdeck/turns": float(self.result.get("turns") or 0)}
        artifacts = {"run_id": self.run_id, "session_id": self.result.get("session_id"),
                     "error_kind": self.result.get("error_kind"), "findings": self.result.get("findings")}
        try:
            from openenv.core.harness import VerifyResult  # unverified path
        except ImportError:
            return Verified(None if reward is None else float(reward), True, metrics, artifacts)
        return VerifyResult(env_reward=None if reward is None else float(reward), done=True,
                            metrics=metrics, artifacts=artifacts)

    def close(self) -> None:
        """Cancel the run if it is still going; release the HTTP client. Safe to call twice."""
        try:
            if self.result is None and not self.http.is_closed:
                self.http.post(f"/admin/runs/{self.run_id}/cancel")
        except httpx.HTTPError:
            pass
        finally:
            self.http.close()


@dataclass
class TapdeckSessionFactory:
    """Picklable factory (no live client inside): `F(sampling=...)` then `F.create(task, ...)`."""

    server: str
    admin_key: str
    dataset: str | None = None
    harness: str = "terminus-2"
    sandbox: str = "host"
    engine: str = "embedded"
    engine_model: str | None = None
    timeout_s: float = 300.0
    reward_key: str | None = None
    agent_kwargs: dict[str, Any] | None = None
    poll_s: float = 1.0
    http_timeout_s: float = 60.0
    sampling: dict[str, Any] | None = None
    """The sampling policy TRL passed. RunPlan has no field to forward it to capture sessions yet:
    kept here and in the trackio config; the engine's defaults must already be neutral."""

    def __call__(self, sampling: dict[str, Any] | None = None) -> TapdeckSessionFactory:
        """TRL's once-per-worker call: a copy bound to the trainer's sampling policy."""
        from dataclasses import replace

        if sampling:
            odd = {k: v for k, v in sampling.items() if k in NEUTRAL_SAMPLING and v != NEUTRAL_SAMPLING[k]}
            if odd:
                raise ValueError(f"non-neutral sampling {odd}: logprobs would not match the trainer's")
        return replace(self, sampling=dict(sampling or {}))

    def client(self) -> httpx.Client:
        """A new admin HTTP client (one per session)."""
        return httpx.Client(base_url=self.server.rstrip("/"), timeout=self.http_timeout_s,
                            headers={"Authorization": f"Bearer {self.admin_key}"})

    def plan(self, task: str) -> dict[str, Any]:
        """The `POST /admin/runs` body for one rollout of `task`."""
        return {"dataset": self.dataset, "tasks": [task], "harness": self.harness,
                "sandbox": self.sandbox, "engine": self.engine, "engine_model": self.engine_model,
                "k": 1, "concurrency": 1, "timeout_s": self.timeout_s,
                "reward_key": self.reward_key, "agent_kwargs": self.agent_kwargs}

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> TapdeckSession:
        """Start one rollout of `task` (a task name, or a dataset row / chat prompt naming one)."""
        return TapdeckSession(self, task_name(task), seed=seed, episode_id=episode_id)


def task_name(task: Any) -> str:
    """The tapdeck task a TRL prompt names: a string, `{"task": ...}`, or a chat whose last user message is it."""
    if isinstance(task, str):
        return task
    if isinstance(task, dict):
        for key in ("task", "name", "prompt"):
            if key in task:
                return task_name(task[key])
    if isinstance(task, list) and task and isinstance(task[-1], dict):
        return str(task[-1].get("content", "")).strip()
    raise TypeError(f"cannot read a task name from {type(task).__name__}: {task!r:.80}")


def read_admin_key(explicit: str | None, data_dir: Path | None) -> str:
    """`--admin-key`, else `$TAPDECK_ADMIN_KEY`, else `<data_dir>/admin.key`."""
    if explicit:
        return explicit
    if os.environ.get("TAPDECK_ADMIN_KEY"):
        return os.environ["TAPDECK_ADMIN_KEY"]
    root = data_dir or Path(os.environ.get("TAPDECK_DATA_DIR") or Path.home() / ".tapdeck")
    path = root / "admin.key"
    if not path.is_file():
        raise FileNotFoundError(f"no admin key: pass --admin-key, set TAPDECK_ADMIN_KEY, or start the "
                                f"server with --data-dir {root} (it writes {path})")
    return path.read_text().strip()


def arg_parser() -> argparse.ArgumentParser:
    """The recipe's options (defaults from TRL's Harbor example, see the reference)."""
    p = argparse.ArgumentParser(prog="tapdeck.runner.recipes.grpo_trl",
                                description="TRL AsyncGRPO on rollouts served by tapdeck (GPU box).")
    p.add_argument("--server", default="http://127.0.0.1:8300", help="tapdeck server URL.")
    p.add_argument("--admin-key", default=None)
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--model", default="Qwen/Qwen3.5-2B", help="Policy model (the one vLLM serves).")
    p.add_argument("--vllm-url", default="http://localhost:8000", help="vLLM server (weight sync).")
    p.add_argument("--dataset", default=None, help="tapdeck dataset (default: the sample dataset).")
    p.add_argument("--tasks", nargs="+", default=None, help="Task names (default: all of the dataset).")
    p.add_argument("--harness", default="terminus-2")
    p.add_argument("--sandbox", default="host")
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--reward-key", default=None)
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--max-inflight", type=int, default=8)
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--learning-rate", type=float, default=1e-6)
    p.add_argument("--max-completion-length", type=int, default=1024)
    p.add_argument("--max-staleness", type=int, default=4)
    p.add_argument("--per-device-batch", type=int, default=4)
    p.add_argument("--output-dir", type=Path, default=None)
    p.add_argument("--project", default=os.environ.get("TAPDECK_TRAIN_PROJECT", "tapdeck"))
    p.add_argument("--run-name", default=os.environ.get("TAPDECK_TRAIN_RUN_ID", "grpo-trl"))
    p.add_argument("--print-vllm-command", action="store_true",
                   help="Print the vLLM command this recipe needs and exit.")
    return p


def factory_from_args(args: argparse.Namespace) -> TapdeckSessionFactory:
    """The session factory the parsed options describe."""
    return TapdeckSessionFactory(server=args.server, admin_key=read_admin_key(args.admin_key, args.data_dir),
                                 dataset=args.dataset, harness=args.harness, sandbox=args.sandbox,
                                 engine=args.vllm_url.rstrip("/") + "/v1", engine_model=args.model,
                                 timeout_s=args.timeout_s, reward_key=args.reward_key)


def main(argv: list[str] | None = None) -> int:
    """Parse, check the server, then train (the training part needs trl, torch, openenv and a GPU)."""
    args = arg_parser().parse_args(argv)
    if args.print_vllm_command:
        print(shlex.join(vllm_command(args.model)))
        return 0
    try:
        factory = factory_from_args(args)
    except FileNotFoundError as exc:
        print(f"grpo-trl: {exc}", file=sys.stderr)
        return 2
    with factory.client() as http:
        try:
            catalog = http.get("/admin/catalog")
            catalog.raise_for_status()
        except httpx.HTTPError as exc:
            print(f"grpo-trl: tapdeck server {args.server} not usable: {exc}", file=sys.stderr)
            return 2
    tasks = args.tasks or _dataset_tasks(catalog.json(), args.dataset)
    if not tasks:
        print("grpo-trl: no tasks to train on (pass --tasks)", file=sys.stderr)
        return 2
    try:
        from datasets import Dataset
        from trl.experimental.async_grpo import (
            AsyncGRPOConfig,
            AsyncGRPOTrainer,
            HarnessRolloutWorker,
        )
    except ImportError as exc:
        print(f"grpo-trl: needs trl 1.16 (+ torch, openenv, datasets) on a GPU box: {exc}. "
              "No training step can run on this machine.", file=sys.stderr)
        return 3
    # Everything below is unverified by execution (see the module docstring).
    config = AsyncGRPOConfig(
        output_dir=str(args.output_dir or Path(os.environ.get("TRACKIO_DIR", ".")).parent / "checkpoints"),
        learning_rate=args.learning_rate, max_steps=args.max_steps,
        per_device_train_batch_size=args.per_device_batch, num_generations=args.num_generations,
        max_completion_length=args.max_completion_length, max_staleness=args.max_staleness,
        report_to="trackio", project=args.project, run_name=args.run_name,
    )
    worker = HarnessRolloutWorker(harness_session_factory=factory, lossless_capture=True,
                                  max_inflight_tasks=args.max_inflight)
    dataset = Dataset.from_list([{"prompt": t} for t in tasks])
    trainer = AsyncGRPOTrainer(model=args.model, args=config, train_dataset=dataset, rollout_worker=worker)
    trainer.train()
    return 0


def _dataset_tasks(catalog: dict[str, Any], dataset: str | None) -> list[str]:
    wanted = dataset or (catalog.get("defaults") or {}).get("dataset")
    for d in catalog.get("datasets") or []:
        if wanted is None or d.get("name") == wanted:
            return [t["name"] for t in d.get("tasks") or []]
    return []


if __name__ == "__main__":
    sys.exit(main())
