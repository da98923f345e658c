"""`grpo-trl`: TRL AsyncGRPO on a GPU box, with every rollout served by a tapdeck server.

How it fits TRL 1.16's loop-owning harness path: `HarnessRolloutWorker(harness_session_factory=F,
**worker kwargs)` pickles its kwargs into a spawned child, whose `_HarnessRolloutLoop` calls
`F(sampling=<the trainer's policy>)` once, then per rollout, on a thread pool,
`create(prompt, seed=group_id, episode_id=...)` → a session on which it calls
`wait_for_completion()`, `fetch_training_trace()`, `verify(transcript)` and always `close()`.
Here one session = one tapdeck run of one rollout (`POST /admin/runs`, k=1): the server runs the
Harbor trial with the harness pointed at its capture proxy, enforces the trainer's sampling policy
on the capture session (`training_sampling`: the trainer's temperature, truncating knobs at their
no-ops; each turn records what the harness requested next to what was sent) and tags it with
TRL's group and episode ids; the trace is the capture (`GET /admin/sessions/{id}/trace`).

A rollout TRL must not train on — graded `degenerate` by the proxy (`tapdeck.schema.rollout_health`:
a single model call, no trainable token, a loss-mask fraction under `--min-loss-mask-fraction`), not
ok, eval tier, a FATAL finding, no trained token — raises `RolloutUnusable` (a RuntimeError), which
TRL scores as an unscorable rollout; a ValueError, TypeError or KeyError would stop TRL's worker
instead (its capture-contract error). TRL logs an unscorable rollout as a warning with no metric, so
a degenerate one's message carries the count of them skipped so far; each is also counted in its
tapdeck run's `counts.degenerate` (`tapdeck runs`, the Runs screen).

This module runs in the training environment (`tapdeck.runner.train_env`: Python 3.11, no tapdeck
dependencies) and reaches tapdeck only through `tapdeck.runner.recipes.admin_client`; the plans it
posts are `tapdeck.schema` models (pydantic only, which the training environment has).

What ran here (a 2-core CPU box, no GPU): the session factory, the traces and TRL's own
`_HarnessRolloutLoop` built with exactly `worker_kwargs(...)`, against a real `tapdeck serve` with
the embedded engine (tests/runner/recipes/test_trl_harness_loop.py). Not run: `AsyncGRPOTrainer`
itself, vLLM and the NCCL weight sync (they need GPUs).

Launch (2 GPUs, one host): `tapdeck train --recipe grpo-trl --dry-run -- --model M ...` prints
the vLLM command (on vLLM's GPU) and the trainer's (on its own), by the rule of
`tapdeck.runner.recipes.gpu_split`; start that vLLM command; then `tapdeck train --recipe grpo-trl
-- --model M ...` (or `--server URL` for a server started apart) starts the trainer with
`CUDA_VISIBLE_DEVICES` set to its GPU alone. scripts/gpu-check.sh does all of it on one box.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import secrets
import shlex
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from tapdeck.runner.recipes.admin_client import AdminClient, AdminError, read_admin_key
from tapdeck.runner.recipes.data_check import TurnRow, check_turn
from tapdeck.runner.recipes.gpu_split import add_gpu_options
from tapdeck.schema.findings import Finding, Level
from tapdeck.schema.rollout_health import (
    DEFAULT_MIN_LOSS_MASK_FRACTION,
    degenerate_reasons,
    loss_mask_fraction,
)
from tapdeck.schema.runs import RolloutTemplate, RunPlan
from tapdeck.schema.settings import RolloutSettings
from tapdeck.schema.tls import CA_FILE_ENV

log = logging.getLogger(__name__)

_degenerate_skipped = itertools.count(1)
"""Numbers the degenerate rollouts this process skips (TRL's sessions run on its threads: a
`next` is one step under the GIL)."""


class RolloutUnusable(RuntimeError):
    """The rollout produced no trainable capture (engine down, eval tier, FATAL findings, no calls).

    A RuntimeError on purpose: TRL turns it into an unscorable rollout instead of stopping training.
    """


def vllm_command(
    model: str,
    *,
    port: int = 8000,
    gpus: list[str] | None = None,
    tool_call_parser: str = "hermes",
    extra: list[str] | None = None,
) -> tuple[dict[str, str], list[str]]:
    """The environment and command line of the vLLM server TRL's NCCL weight sync and tapdeck's
    capture both need, on `gpus` (default GPU 0; several: tensor parallel over them).

    `--enable-auto-tool-choice` needs a `--tool-call-parser` matching the model's chat template
    (hermes for Qwen2.5/Qwen3 instruct models, qwen3_xml for Qwen3.5).
    """
    gpus = gpus or ["0"]
    env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus), "VLLM_SERVER_DEV_MODE": "1"}
    argv = [
        "vllm",
        "serve",
        model,
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
        "--logprobs-mode",
        "processed_logprobs",
        "--return-tokens-as-token-ids",
        "--weight-transfer-config",
        '{"backend":"nccl"}',
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        tool_call_parser,
        *(["--tensor-parallel-size", str(len(gpus))] if len(gpus) > 1 else []),
        *(extra or []),
    ]
    return env, argv


def engine_command(args: list[str], gpus: list[str]) -> tuple[dict[str, str], list[str]]:
    """vLLM's environment and command for a launch with these recipe args, on `gpus`: the model,
    the port of `--vllm-url` and the tool-call parser they name."""
    parsed = arg_parser().parse_args(args)
    return vllm_command(
        parsed.model,
        port=urlsplit(parsed.vllm_url).port or 8000,
        gpus=gpus,
        tool_call_parser=parsed.tool_call_parser,
    )


def shell_line(env: dict[str, str], argv: list[str]) -> str:
    """`NAME=value ... command args` as a shell reads it."""
    return shlex.join([f"{k}={v}" for k, v in env.items()] + argv)


def check_trace(trace: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The `{schema_version, turns}` TRL may train on, or RolloutUnusable saying why not.

    `result` is the rollout's result from its run (ok, tier, findings); `trace` its session's trace.
    """
    sid = result.get("session_id")
    findings = [Finding.model_validate(f) for f in result.get("findings") or []]
    if reasons := degenerate_reasons(findings):
        raise RolloutUnusable(
            f"session {sid}: degenerate ({', '.join(reasons)}), skipped as unscorable; "
            f"{next(_degenerate_skipped)} degenerate rollout(s) skipped so far"
        )
    if not result.get("ok"):
        raise RolloutUnusable(
            f"session {sid}: rollout not ok ({result.get('error_kind') or 'findings'}: "
            f"{result.get('error') or '; '.join(map(str, findings))[:300]})"
        )
    fatal = [str(f) for f in findings if f.level is Level.FATAL]
    if fatal:
        raise RolloutUnusable(f"session {sid}: FATAL finding(s): {'; '.join(fatal[:3])}")
    if trace.get("tier") != "tokens":
        raise RolloutUnusable(f"session {sid}: tier {trace.get('tier')}, not tokens: eval only")
    turns = trace.get("turns") or []
    if not turns:
        raise RolloutUnusable(f"session {sid}: the trace has no agent turn")
    problems = [
        p
        for t in turns
        for p in check_turn(
            TurnRow(
                t.get("node_id"),
                t.get("prompt_token_ids"),
                t.get("completion_token_ids"),
                t.get("per_token_logps"),
                t.get("loss_mask"),
            )
        )
    ]
    if problems:
        raise RolloutUnusable(f"session {sid}: {'; '.join(problems[:3])}")
    if not any(any(t["loss_mask"]) for t in turns):
        raise RolloutUnusable(f"session {sid}: no trained token in any turn")
    return {"schema_version": trace.get("schema_version"), "turns": turns}


class TapdeckSession:
    """One rollout on a tapdeck server, shaped like OpenEnv's `TrainableSession`."""

    def __init__(
        self, factory: TapdeckSessionFactory, task: str, *, seed: int | None, episode_id: str | None
    ) -> None:
        self.factory = factory
        self.task = task
        self.result: dict[str, Any] | None = None
        self.admin = factory.client()
        try:
            plan = factory.plan(task, seed=seed, episode_id=episode_id)
            self.run_id = self.admin.start_run(plan.model_dump(mode="json", exclude_unset=True))
        except AdminError as exc:
            self.admin.close()
            raise RolloutUnusable(f"tapdeck refused the run for task {task!r}: {exc}") from exc

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        """Block until the run ends; the number of captured model calls. TimeoutError past `timeout_s`."""
        run = self.admin.wait_run(self.run_id, timeout_s=timeout_s, poll_s=self.factory.poll_s)
        rollouts = run.get("rollouts") or []
        self.result = (
            rollouts[0] if rollouts else {"ok": False, "reward": None, "error": f"run ended {run['state']}"}
        )
        return int(self.result.get("turns") or 0)

    def fetch_training_trace(self) -> Any:
        """The capture as OpenEnv's `TrainingTrace`; RolloutUnusable when TRL must not train on it."""
        if self.result is None:
            self.wait_for_completion()
        assert self.result is not None
        session_id = self.result.get("session_id")
        if not session_id:
            raise RolloutUnusable(
                f"run {self.run_id}: no capture session "
                f"({self.result.get('error_kind') or 'no model calls'}: "
                f"{self.result.get('error') or 'nothing to train on'})"
            )
        try:
            trace = self.admin.trace(session_id)
        except AdminError as exc:
            raise RolloutUnusable(f"session {session_id}: no training trace ({exc})") from exc
        checked = check_trace(trace, self.result)
        from openenv.core.harness import TrainingTrace

        try:
            return TrainingTrace.model_validate(checked)
        except ValueError as exc:
            # Past check_trace this is a tapdeck export bug: drop the rollout loudly, keep training.
            log.error("session %s: trace rejected by OpenEnv's TrainingTrace: %s", session_id, exc)
            raise RolloutUnusable(f"session {session_id}: trace rejected by TrainingTrace: {exc}") from exc

    def verify(self, transcript: Any = None, final_state: Any = None) -> Any:
        """OpenEnv's VerifyResult with tapdeck's verifier reward (None = never graded, never 0)."""
        from openenv.core.harness import VerifyResult

        if self.result is None:
            self.wait_for_completion()
        assert self.result is not None
        reward = self.result.get("reward")
        metrics = {
            "tapdeck/ok": float(bool(self.result.get("ok"))),
            "tapdeck/turns": float(self.result.get("turns") or 0),
        }
        artifacts = {
            "run_id": self.run_id,
            "session_id": self.result.get("session_id"),
            "error_kind": self.result.get("error_kind"),
            "findings": self.result.get("findings"),
        }
        return VerifyResult(
            env_reward=None if reward is None else float(reward),
            done=True,
            metrics=metrics,
            artifacts=artifacts,
        )

    def close(self) -> None:
        """Cancel the run if it is still going; release the HTTP client. Safe to call twice."""
        try:
            if self.result is None and not self.admin.closed:
                self.admin.cancel_run(self.run_id)
        except AdminError:
            pass
        finally:
            self.admin.close()


@dataclass
class TapdeckSessionFactory:
    """Picklable factory (no live client inside): `F(sampling=...)` then `F.create(task, ...)`."""

    server: str
    admin_key: str
    ca_file: str | None = None
    """What an https server's certificate is checked against (see AdminClient)."""
    dataset: str | None = None
    harness: str = "terminus-2"
    sandbox: str = "host"
    engine: str = "embedded"
    engine_model: str | None = None
    timeout_s: float = 300.0
    reward_key: str | None = None
    agent_kwargs: dict[str, Any] | None = None
    """Harbor agent kwargs (folded into the rollout's settings; `settings` wins where both say)."""
    settings: RolloutSettings | None = None
    """The agent settings each rollout runs with (a --run's plan gives them)."""
    call_budget: int | None = None
    """Model calls per rollout before the proxy answers with a stop (None: the server's default)."""
    min_loss_mask_fraction: float | None = None
    """Below this share of its sampled tokens in the loss a rollout is degenerate (None: the default)."""
    poll_s: float = 1.0
    http_timeout_s: float = 60.0
    group_size: int | None = None
    """The trainer's `num_generations`, recorded on each capture session next to TRL's group id."""
    sampling: dict[str, Any] | None = None
    """The trainer's sampling policy (TRL passes it, validated by OpenEnv's `training_sampling`);
    the server enforces it on each training-tier capture session."""

    def __call__(self, sampling: dict[str, Any] | None = None) -> TapdeckSessionFactory:
        """TRL's once-per-worker call: a copy bound to the trainer's sampling policy."""
        return replace(self, sampling=dict(sampling) if sampling else None)

    def client(self) -> AdminClient:
        """A new admin client (one per session: sessions run on TRL's thread pool)."""
        return AdminClient(self.server, self.admin_key, timeout_s=self.http_timeout_s, ca_file=self.ca_file)

    def plan(self, task: str, *, seed: int | None = None, episode_id: str | None = None) -> RunPlan:
        """The `POST /admin/runs` plan for one rollout of `task`."""
        settings = None if self.settings is None else self.settings.model_dump(exclude_unset=True)
        return RunPlan(
            dataset=self.dataset,
            tasks=[task],
            rollout=RolloutTemplate.model_validate(
                {
                    "harness": self.harness,
                    "sandbox": self.sandbox,
                    "engine": self.engine,
                    "engine_model": self.engine_model,
                    "timeout_s": self.timeout_s,
                    "reward_key": self.reward_key,
                    "agent_kwargs": self.agent_kwargs,
                    "settings": settings,
                    "call_budget": self.call_budget,
                    "min_loss_mask_fraction": self.min_loss_mask_fraction,
                    "training_sampling": self.sampling,
                    "metadata": {
                        "trl_group_id": seed,
                        "trl_episode_id": episode_id,
                        "trl_group_size": self.group_size,
                    },
                }
            ),
        )

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> TapdeckSession:
        """Start one rollout of `task` (a task name, or a dataset row / chat prompt naming one)."""
        return TapdeckSession(self, task_name(task), seed=seed, episode_id=episode_id)


def task_name(task: Any) -> str:
    """The tapdeck task a TRL prompt names: a string, `{"task": ...}`, or a chat whose last user
    message is it."""
    if isinstance(task, str):
        return task
    if isinstance(task, dict):
        for key in ("task", "name", "prompt"):
            if key in task:
                return task_name(task[key])
    if isinstance(task, list) and task and isinstance(task[-1], dict):
        return str(task[-1].get("content", "")).strip()
    raise TypeError(f"cannot read a task name from {type(task).__name__}: {task!r:.80}")


def dataset_rows(tasks: list[str]) -> list[dict[str, Any]]:
    """TRL dataset rows: one per task, the prompt a one-message chat naming it (`task_name` reads it)."""
    return [{"prompt": [{"role": "user", "content": t}], "task": t} for t in tasks]


def eos_token_ids(generation_eos: int | list[int] | None, tokenizer_eos: int | None) -> list[int]:
    """Every id that ends a completion, as AsyncGRPOTrainer derives it: the model's generation-config
    eos id(s), with the tokenizer's eos first when it is not among them."""
    ids = (
        []
        if generation_eos is None
        else [generation_eos]
        if isinstance(generation_eos, int)
        else list(generation_eos)
    )
    return ids if tokenizer_eos is None or tokenizer_eos in ids else [tokenizer_eos, *ids]


def config_kwargs(args: argparse.Namespace, *, run_name: str, output_dir: Path) -> dict[str, Any]:
    """`AsyncGRPOConfig` fields: sampling kept full-vocabulary (OpenEnv refuses anything else)."""
    return {
        "output_dir": str(output_dir),
        "run_name": run_name,
        "project": args.project,
        "report_to": "trackio",
        "learning_rate": args.learning_rate,
        "max_steps": args.max_steps,
        "per_device_train_batch_size": args.per_device_batch,
        "num_generations": args.num_generations,
        "max_completion_length": args.max_completion_length,
        "max_staleness": args.max_staleness,
        "max_inflight_tasks": args.max_inflight,
        "temperature": args.temperature,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": None,
        "repetition_penalty": 1.0,
        "vllm_server_base_url": args.vllm_url.rstrip("/"),
    }


def worker_kwargs(
    config: Any,
    *,
    model_name: str,
    dataset: Any,
    processing_class: Any,
    eos_ids: list[int],
    factory: TapdeckSessionFactory,
) -> dict[str, Any]:
    """`HarnessRolloutWorker`'s kwargs: what AsyncGRPOTrainer gives its own worker, from the same
    config, plus the session factory. No reward functions: the harness's verifier is the reward.
    The vLLM URL is the weight-sync server's; in loop-owning mode the loop never samples from it."""
    return {
        "harness_session_factory": factory,
        "lossless_capture": True,
        "model_name": model_name,
        "dataset": dataset,
        "reward_funcs": [],
        "processing_class": processing_class,
        "eos_token_ids": eos_ids,
        "num_generations": config.num_generations,
        "max_inflight_tasks": config.max_inflight_tasks,
        "queue_maxsize": config.queue_maxsize,
        "vllm_server_url": config.vllm_server_base_url,
        "max_tokens": config.max_completion_length,
        "temperature": config.temperature,
        "top_p": config.top_p,
        "top_k": config.top_k,
        "min_p": config.min_p,
        "repetition_penalty": config.repetition_penalty,
        "request_timeout": config.request_timeout,
        "chat_template_kwargs": config.chat_template_kwargs,
        "max_tool_calling_iterations": config.max_tool_calling_iterations,
        "log_completions": config.log_completions,
        "num_completions_to_print": config.num_completions_to_print,
        "fork_threshold_tokens": config.fork_threshold_tokens,
    }


def launch_names(explicit_run_name: str | None, output_dir: Path | None) -> tuple[str, Path]:
    """A run name and output dir unique to this launch (tapdeck's launcher passes a unique run id)."""
    name = (
        explicit_run_name
        or os.environ.get("TAPDECK_TRAIN_RUN_ID")
        or f"grpo-trl-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    )
    if output_dir is None:
        trackio_dir = os.environ.get("TRACKIO_DIR")
        output_dir = Path(trackio_dir).parent / "checkpoints" if trackio_dir else Path("grpo-trl-runs") / name
    return name, output_dir


def arg_parser() -> argparse.ArgumentParser:
    """The recipe's options (defaults from TRL's Harbor example, see the reference)."""
    p = argparse.ArgumentParser(
        prog="tapdeck.runner.recipes.grpo_trl",
        allow_abbrev=False,
        description="TRL AsyncGRPO on rollouts served by tapdeck (GPU box).",
    )
    p.add_argument("--server", default="http://127.0.0.1:8300", help="tapdeck server URL.")
    p.add_argument("--admin-key", default=None)
    p.add_argument("--data-dir", type=Path, default=None, help="Where the server's admin.key is.")
    p.add_argument(
        "--ca-file",
        default=os.environ.get(CA_FILE_ENV),
        help=f"PEM certificates to trust for an https:// server (default ${CA_FILE_ENV}; "
        "else the public CAs).",
    )
    p.add_argument("--model", default="Qwen/Qwen3.5-2B", help="Policy model (the one vLLM serves).")
    p.add_argument(
        "--vllm-url",
        default="http://localhost:8000",
        help="vLLM server the trainer syncs weights into (AsyncGRPOConfig.vllm_server_base_url).",
    )
    p.add_argument(
        "--engine-url",
        default=None,
        help="Engine the tapdeck rollouts sample from: a URL, or `embedded` for the "
        "server's default engine (default: VLLM_URL/v1).",
    )
    p.add_argument(
        "--run",
        default=None,
        help="A tapdeck rollout run: train on its plan's dataset, tasks, harness and sandbox.",
    )
    p.add_argument("--dataset", default=None, help="tapdeck dataset (default: the sample dataset).")
    p.add_argument("--tasks", nargs="+", default=None, help="Task names (default: all of the dataset).")
    p.add_argument("--harness", default=None, help="Default terminus-2.")
    p.add_argument("--sandbox", default=None, help="Default host.")
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--reward-key", default=None)
    p.add_argument("--call-budget", type=int, default=None, help="Model calls per rollout (server default).")
    p.add_argument(
        "--min-loss-mask-fraction",
        type=loss_mask_fraction,
        default=DEFAULT_MIN_LOSS_MASK_FRACTION,
        help="A rollout with a smaller share of its sampled tokens in the loss (0 to 1) is degenerate "
        "and skipped, as are single-call ones and those with no trainable token (0: no fraction check).",
    )
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--max-inflight", type=int, default=8)
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--learning-rate", type=float, default=1e-6)
    p.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="Sampling temperature: the trainer's, enforced on every capture session.",
    )
    p.add_argument("--max-completion-length", type=int, default=1024)
    p.add_argument("--max-staleness", type=int, default=4)
    p.add_argument("--per-device-batch", type=int, default=4)
    p.add_argument("--tool-call-parser", default="hermes", help="vLLM's, in the command it is given.")
    add_gpu_options(p)
    p.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help="Checkpoints (default: the tapdeck run's folder, else grpo-trl-runs/RUN_NAME).",
    )
    p.add_argument("--project", default=os.environ.get("TAPDECK_TRAIN_PROJECT", "tapdeck"))
    p.add_argument(
        "--run-name",
        default=None,
        help="trackio run name (default: the launcher's run id, else a fresh unique name).",
    )
    p.add_argument(
        "--print-vllm-command",
        action="store_true",
        help="Print the vLLM command this recipe needs (on --vllm-gpus, default 0) and exit.",
    )
    return p


def factory_from_args(args: argparse.Namespace, plan: RunPlan | None = None) -> TapdeckSessionFactory:
    """The session factory the parsed options describe (`plan`: the --run's plan, for defaults)."""
    plan = plan or RunPlan()
    template = plan.rollout
    return TapdeckSessionFactory(
        server=args.server,
        admin_key=read_admin_key(args.admin_key, args.data_dir),
        ca_file=args.ca_file,
        dataset=args.dataset or plan.dataset,
        harness=args.harness or template.harness,
        sandbox=args.sandbox or template.sandbox,
        engine=args.engine_url or args.vllm_url.rstrip("/") + "/v1",
        engine_model=args.model,
        timeout_s=args.timeout_s,
        reward_key=args.reward_key or template.reward_key,
        settings=template.settings,
        call_budget=args.call_budget or template.call_budget,
        min_loss_mask_fraction=args.min_loss_mask_fraction,
        group_size=args.num_generations,
    )


def posting_versions(worker: Any, factory: TapdeckSessionFactory) -> Any:
    """`worker` whose `update_model_version` (AsyncGRPOTrainer calls it after every weight sync)
    also posts the version to the tapdeck server, for every engine: the turns its vLLM samples
    from then on are stamped with it, and a call in flight across the sync straddles."""
    update = worker.update_model_version

    def update_and_post(model_version: int) -> None:
        update(model_version)
        admin = factory.client()
        try:
            admin.post_engine_version(int(model_version))
        finally:
            admin.close()

    worker.update_model_version = update_and_post
    return worker


def training_stack() -> SimpleNamespace:
    """The TRL, transformers and datasets classes `main` trains with (ImportError outside the
    training environment; tests/runner/test_train_env.py imports them there)."""
    from datasets import Dataset
    from transformers import AutoTokenizer, GenerationConfig
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
    from trl.experimental.async_grpo.openenv_harness import HarnessRolloutWorker

    return SimpleNamespace(
        Dataset=Dataset,
        AutoTokenizer=AutoTokenizer,
        GenerationConfig=GenerationConfig,
        AsyncGRPOConfig=AsyncGRPOConfig,
        AsyncGRPOTrainer=AsyncGRPOTrainer,
        HarnessRolloutWorker=HarnessRolloutWorker,
    )


def main(argv: list[str] | None = None) -> int:
    """Parse, check the server, then train (the training part needs trl, torch, openenv and a GPU)."""
    args = arg_parser().parse_args(argv)
    if args.print_vllm_command:
        env, argv = vllm_command(
            args.model,
            port=urlsplit(args.vllm_url).port or 8000,
            gpus=args.vllm_gpus,
            tool_call_parser=args.tool_call_parser,
        )
        print(shell_line(env, argv))
        return 0
    try:
        admin = AdminClient(args.server, read_admin_key(args.admin_key, args.data_dir), ca_file=args.ca_file)
    except (FileNotFoundError, ValueError) as exc:  # no admin key; a --ca-file that cannot be read
        print(f"grpo-trl: {exc}", file=sys.stderr)
        return 2
    try:
        plan = RunPlan.model_validate(admin.run(args.run)["plan"]) if args.run else None
        catalog = admin.catalog()
    except AdminError as exc:
        print(f"grpo-trl: tapdeck server {args.server} not usable: {exc}", file=sys.stderr)
        return 2
    finally:
        admin.close()
    factory = factory_from_args(args, plan)
    tasks = args.tasks or (plan.tasks if plan else None) or _dataset_tasks(catalog, factory.dataset)
    if not tasks:
        print("grpo-trl: no tasks to train on (pass --tasks)", file=sys.stderr)
        return 2
    try:
        stack = training_stack()
    except ImportError as exc:
        print(
            f"grpo-trl: needs trl 1.16, torch, openenv and datasets (the training environment, "
            f"scripts/train-env.sh) and vllm on a GPU box: {exc}",
            file=sys.stderr,
        )
        return 3
    run_name, output_dir = launch_names(args.run_name, args.output_dir)
    print(f"grpo-trl: run {run_name}, {len(tasks)} task(s), output {output_dir}")
    config = stack.AsyncGRPOConfig(**config_kwargs(args, run_name=run_name, output_dir=output_dir))
    tokenizer = stack.AutoTokenizer.from_pretrained(args.model)
    eos_ids = eos_token_ids(
        stack.GenerationConfig.from_pretrained(args.model).eos_token_id, tokenizer.eos_token_id
    )
    dataset = stack.Dataset.from_list(dataset_rows(list(tasks)))
    # Not run here: the worker's constructor needs vllm, and the trainer a GPU and a vLLM server.
    worker = posting_versions(
        stack.HarnessRolloutWorker(
            **worker_kwargs(
                config,
                model_name=args.model,
                dataset=dataset,
                processing_class=tokenizer,
                eos_ids=eos_ids,
                factory=factory,
            )
        ),
        factory,
    )
    trainer = stack.AsyncGRPOTrainer(
        model=args.model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_worker=worker,
    )
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
