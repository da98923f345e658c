"""The closed RL loop on a CPU: `cpu-grpo` launched as a server job trains SmolLM2-135M with TRL's
GRPOTrainer on real tapdeck rollouts (the learnable task set, terminus-2, host sandbox, through the
proxy) sampled by the engine that serves the weights being trained; the weights it loads from the
served F16 file are the shipped Q4_1 file's.

Needs the training environment (scripts/train-env.sh; built here when missing and the script is
present). One run of two optimizer steps, each on a group of 2 one-turn rollouts (2 model calls of
8 tokens each), with one held-out eval rollout before and after.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tapdeck.runner.engine.model_file import default_model_path, shipped_model_path
from tapdeck.runner.recipes.cpu_grpo import (
    TapdeckRollouts,
    arg_parser,
    format_score,
    is_flat,
    sample_from_rollout,
    verifier,
)
from tapdeck.runner.recipes.logprob_mismatch import MAX, MEAN, OUTSIDE
from tapdeck.runner.training import train_python
from tapdeck.schema.rollout_health import DEFAULT_MIN_LOSS_MASK_FRACTION

REPO = Path(__file__).resolve().parents[3]
LOGPROB_TOLERANCE = 1e-3
"""Engine (fp32, KV cache, token by token) vs trainer (fp32, one full forward pass): measured
~3e-5 apart here; the one step at lr 1e-4 moves these logprobs by far more than this."""


@pytest.fixture(scope="module")
def train_env() -> Path:
    """The training environment's python, made by scripts/train-env.sh when it is missing."""
    python = train_python()
    if not python.exists():
        script = REPO / "scripts" / "train-env.sh"
        if not script.exists():
            pytest.skip(f"no training environment at {python} and no scripts/train-env.sh to make one")
        subprocess.run(["bash", str(script)], check=True, timeout=3600, stdout=subprocess.DEVNULL)
    return python


def test_format_score_gives_partial_credit_for_terminus_json() -> None:
    assert format_score("") == 0.0 and format_score("ls -la") == 0.0
    assert format_score('I will write "analysis" then "plan"') == pytest.approx(0.5 * 2 / 3)
    assert format_score('{"analysis": "x", "plan": "y", "comm') == pytest.approx(0.25 + 0.5 * 2 / 3)
    assert format_score('{"analysis": "", "plan": "", "commands": []}') == 1.0
    assert format_score("{not json") == 0.25


def test_sample_from_rollout_splits_at_the_first_trained_token_and_keeps_the_mask() -> None:
    doc = {
        "sequences": [
            {"role": "auxiliary", "input_ids": [9, 9], "loss_mask": [0, 1], "logprobs": [0.0, -1.0]},
            {
                "role": "agent",
                "input_ids": [1, 2, 3, 4, 5, 6, 7],
                "loss_mask": [0, 0, 1, 1, 0, 1, 1],
                "logprobs": [0.0, 0.0, -0.5, -0.25, 0.0, -2.0, -0.125],
            },
            {"role": "agent", "input_ids": [1, 2, 8], "loss_mask": [0, 0, 1], "logprobs": [0.0, 0.0, -3.0]},
        ]
    }
    sample, n_agent = sample_from_rollout(doc)
    assert n_agent == 2
    assert sample == {
        "prompt_ids": [1, 2],
        "completion_ids": [3, 4, 5, 6, 7],
        "env_mask": [1, 1, 0, 1, 1],
        "logprobs": [-0.5, -0.25, 0.0, -2.0, -0.125],
    }
    with pytest.raises(ValueError):
        sample_from_rollout(
            {"sequences": [{"role": "agent", "input_ids": [1], "loss_mask": [0], "logprobs": [0.0]}]}
        )


def row(verifier: float | None, fmt: float | None) -> tuple[dict, float | None, float | None, dict]:
    return {}, verifier, fmt, {}


def test_a_group_is_flat_when_its_scorable_rollouts_have_the_same_total_reward() -> None:
    assert is_flat([row(0.0, 0.25), row(0.0, 0.25), row(0.0, 0.25)])
    assert is_flat([row(None, None), row(None, None)])
    assert not is_flat([row(0.0, 0.25), row(1.0, 0.25)])
    assert not is_flat([row(0.0, 0.5), row(0.5, 0.0), row(0.0, 0.0)])
    # TRL's group baseline leaves unscorable rollouts (degenerate ones too) out, and gives them no
    # advantage: they are neither a score of 0 nor a reason to call the rest varied.
    assert not is_flat([row(0.0, 0.0), row(None, None), row(1.0, 0.0)])
    assert is_flat([row(0.0, 0.0), row(None, None), row(0.0, 0.0)])
    assert is_flat([row(1.0, 0.0), row(None, None)])  # one scorable: nothing to compare it with


class ScriptedRollouts(TapdeckRollouts):
    """The redraw logic over scripted groups instead of server runs."""

    def __init__(self, draws: list[list], redraws: int) -> None:
        super().__init__(None, None, group_size=2, plan={}, timeout_s=1, eos_id=0, redraws=redraws)
        self.draws = draws
        self.submitted: list[str] = []

    def _submit(self, task: str) -> str:
        self.submitted.append(task)
        return str(len(self.submitted) - 1)

    def _collect(self, run_id: str) -> list:
        return self.draws[int(run_id)]


def test_a_flat_group_is_drawn_again_until_its_rewards_differ() -> None:
    flat, varied = [row(0.0, 0.0), row(0.0, 0.0)], [row(0.0, 0.0), row(0.0, 0.5)]
    rollouts = ScriptedRollouts([flat, flat, varied, flat], redraws=5)
    group = rollouts._redraw_while_flat("hello-file", rollouts._collect(rollouts._submit("hello-file")))
    assert group == varied and rollouts.submitted == ["hello-file"] * 3
    assert [stats["redraws"] for *_, stats in group] == [2.0, 2.0]


def test_redraws_stop_at_the_limit_and_keep_the_last_draw() -> None:
    flat = [[row(0.0, float(i)), row(0.0, float(i))] for i in range(4)]
    rollouts = ScriptedRollouts(flat, redraws=2)
    group = rollouts._redraw_while_flat("t", rollouts._collect(rollouts._submit("t")))
    assert group == flat[2] and len(rollouts.submitted) == 3


class NoServer:
    """An http client that must not be used: a degenerate rollout is skipped before any request."""

    def get(self, path: str) -> Any:
        raise AssertionError(f"fetched {path} for a rollout graded degenerate")


def test_degenerate_rollouts_are_skipped_as_unscorable_and_counted(capsys) -> None:
    rollouts = TapdeckRollouts(NoServer(), None, group_size=2, plan={}, timeout_s=1, eos_id=0)
    degenerate = {
        "session_id": "s-1",
        "ok": True,
        "reward": 1.0,
        "findings": [{"level": "WARN", "code": "degenerate", "detail": "single_call: one model call"}],
    }
    drawn = [rollouts._sample(degenerate), rollouts._sample(degenerate)]
    for sample, verifier_reward, fmt, stats in drawn:
        assert (verifier_reward, fmt) == (None, None)  # unscorable, whatever its reward
        assert sample["env_mask"] == [0] and stats["degenerate"] == 1.0 and stats["scorable"] == 0.0
    assert rollouts.degenerate_total == 2
    assert "unscorable rollout: degenerate (single_call), session s-1" in capsys.readouterr().out
    healthy = {"turns": 2.0, "agent_sequences": 1.0, "scorable": 1.0, "ok": 1.0, "degenerate": 0.0}
    logged: dict[str, float] = {}
    verifier([], [], [None, None, 0.0], [drawn[0][3], drawn[1][3], healthy], log_metric=logged.__setitem__)
    # A count per step, not a share; the others stay means.
    assert logged["rollout/degenerate"] == 2.0 and logged["rollout/scorable"] == pytest.approx(1 / 3)


def test_the_loss_mask_threshold_is_a_flag_with_the_documented_default() -> None:
    assert arg_parser().parse_args([]).min_loss_mask_fraction == DEFAULT_MIN_LOSS_MASK_FRACTION
    assert arg_parser().parse_args(["--min-loss-mask-fraction", "0"]).min_loss_mask_fraction == 0.0
    with pytest.raises(SystemExit):
        arg_parser().parse_args(["--min-loss-mask-fraction", "1.5"])


@pytest.mark.medium
def test_cpu_grpo_refuses_a_task_the_dataset_lacks_before_loading_its_model(
    train_server: Any, tmp_path: Path
) -> None:
    import sys

    from tapdeck.runner.training import TrainingRun, load_run

    lines: list[str] = []
    # The server's own Python has no torch: the recipe must say so before it would import it.
    job = TrainingRun(
        "cpu-grpo",
        ["--tasks", "hello-file,hello-fil"],
        data_dir=tmp_path / "data",
        python=sys.executable,
        on_line=lines.append,
        extra_env={"TAPDECK_SERVER_URL": train_server.url, "TAPDECK_ADMIN_KEY": train_server.admin_key},
    ).start()
    assert job.wait() == 2, lines
    assert lines == [
        "cpu-grpo: unknown task(s) hello-fil; the dataset has fizzbuzz-python, "
        "greet-script, hello-file, json-config, sum-numbers"
    ]
    assert load_run(tmp_path / "data", job.run_id).error.startswith("cpu-grpo: unknown task(s)")


class OneCallRollouts(TapdeckRollouts):
    """`rollout_func` whose group is one model call through a real capture server's proxy (a
    session per draw), so the step's version posting is what stamps the captured turns."""

    def __init__(self, capture: Any, engine: Any) -> None:
        super().__init__(capture.admin, engine, group_size=1, plan={}, timeout_s=60, eos_id=0)
        self.capture = capture
        self.sessions: list[str] = []

    def _submit(self, task: str) -> str:
        info = self.capture.open_session(rollout_type="train")
        self.sessions.append(info["id"])
        call_through(self.capture, info["api_key"])
        return info["id"]

    def _collect(self, run_id: str) -> list:
        return [
            (
                {"prompt_ids": [0], "completion_ids": [0], "env_mask": [1], "logprobs": [0.0]},
                0.0,
                0.0,
                {"turns": 1.0, "agent_sequences": 1.0, "scorable": 1.0, "ok": 1.0, "degenerate": 0.0},
            )
        ]


def call_through(capture: Any, key: str) -> None:
    import httpx

    from tests.support.vllm_recordings import vllm_fixture

    reply = httpx.post(
        f"{capture.url}/v1/chat/completions",
        json=vllm_fixture("chat_basic")["request"],
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert reply.status_code == 200, reply.text


def test_each_steps_rollouts_are_stamped_with_the_steps_taken_and_a_call_across_a_step_straddles(
    tmp_path: Path,
) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from tapdeck.proxy.upstream.tiers import EngineSpec
    from tests.support.capture_server import capture_server
    from tests.support.fake_vllm import FakeVllm

    with (
        FakeVllm() as up,  # an engine that reports no version of its own, as the policy engine
        capture_server(EngineSpec(url=up.base_url), tmp_path, keepalive_s=0.5) as capture,
    ):
        policy = SimpleNamespace(base_url=up.base_url, weights_changed=lambda: None)
        rollouts = OneCallRollouts(capture, policy)
        for step in (0, 1):  # GRPOTrainer calls rollout_func once per step, global_step = steps taken
            rollouts(["hello-file"], SimpleNamespace(state=SimpleNamespace(global_step=step)))
        stamped = [capture.turn(sid, 0)["policy_version"] for sid in rollouts.sessions]
        assert stamped == [0, 1]

        # A rollout left running across the next step: its call is in flight when step 2 is posted.
        info = capture.open_session(rollout_type="train")
        up.gate = threading.Event()
        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(call_through, capture, info["api_key"])
            try:
                assert up.arrived.wait(30)
                rollouts.post_version(2)
            finally:
                up.gate.set()
            call.result(timeout=60)
        turn = capture.turn(info["id"], 0)
        assert turn["policy_version"] is None and turn["policy_version_straddled"] == [1, 2]
        assert "policy_version_straddled" in {f["code"] for f in turn["findings"]}


@pytest.mark.slow
def test_two_cpu_grpo_steps_on_the_learn_set_sample_from_each_steps_weights_and_eval_around_them(
    train_env: Path, train_server: Any
) -> None:
    """The smallest run that has two steps on the learnable set (2 one-turn rollouts of 8-token
    replies per step) and an eval of one held-out rollout before and after; one run, for the five
    checks below that each need a real model trained on real rollouts (each cpu-grpo run loads the
    model and dequantises it: a test of its own would add a minute or more). Two calls a rollout:
    terminus-2 re-asks after a reply cut at 8 tokens, and a one-call rollout would be skipped as
    degenerate. A group whose rollouts all score the same is drawn again, up to 6 times: with
    8-token replies most draws score alike (4 flat draws in a row were seen twice in 3 runs here,
    2026-12-07), and a first step that teaches nothing fails the test."""
    http = train_server.http
    args = ["--dataset", "learn", "--tasks", "reply-fruit", "--group-size", "2", "--steps", "2"]
    args += ["--eval-dataset", "learn-eval", "--eval-tasks", "reply-snack", "--eval-k", "1"]
    args += ["--max-turns", "1", "--max-tokens", "8", "--call-budget", "2", "--redraws", "6"]
    args += ["--lr", "1e-4", "--check-logprobs", "--check-weights", str(shipped_model_path())]
    args += ["--rollout-timeout", "1200"]
    resp = http.post("/admin/train", json={"recipe": "cpu-grpo", "args": args})
    assert resp.status_code == 200, resp.text
    job = resp.json()
    assert job["argv"][0] == str(train_env)
    deadline = time.monotonic() + 3000
    while (state := http.get(f"/admin/train/{job['id']}").json())["state"] == "running":
        assert time.monotonic() < deadline, "cpu-grpo still running"
        time.sleep(2)
    lines = http.get(f"/admin/train/{job['id']}/log", params={"tail": 200}).json()["lines"]
    log = "\n".join(lines)
    assert state["state"] == "finished", f"{state['error']}\n{log}"
    points = http.get(f"/admin/train/{job['id']}/metrics").json()["points"]
    by_name: dict[str, list[tuple[int, float]]] = {}
    for p in points:
        by_name.setdefault(p["name"], []).append((p["step"], p["value"]))

    # 1. The trainer dequantised the served F16 file to the shipped Q4_1 file's weights (to within
    # F16 rounding): what it rescores and trains is what the engine sampled from.
    weights = json.loads((Path(job["run_dir"]) / "weights_check.json").read_text())
    assert weights["model"] == str(default_model_path())
    assert weights["only_in_one"] == [] and weights["shape_differs"] == []
    assert len(weights["excess"]) > 200  # every layer's tensors were compared
    assert max(weights["excess"].values()) <= 0, {k: v for k, v in weights["excess"].items() if v > 0}

    # 2. trackio got TRL's metrics (read back by the server from the run's SQLite), and each step
    # the sampler-trainer mismatch: fp32 on both sides, a few 1e-5 apart, no ratio near 2.
    assert {
        "train/reward",
        "train/reward_std",
        "train/loss",
        "train/frac_reward_zero_std",
        "train/rewards/verifier/mean",
        "train/rewards/reply_format/mean",
        "train/rollout/sampled_tok_s",
        "train/completions/mean_length",
        "train/rollout/redraws",
    } <= set(by_name), sorted(by_name)
    for name in (MEAN, MAX, OUTSIDE):
        values = [v for _, v in by_name.get(f"train/{name}", [])]
        assert len(values) == 2, (name, sorted(by_name))  # one per step
        assert all(v >= 0 for v in values)
    assert max(v for _, v in by_name[f"train/{MAX}"]) < 0.05
    assert [v for _, v in by_name[f"train/{OUTSIDE}"]] == [0.0, 0.0]
    means = [v for _, v in by_name[f"train/{MEAN}"]]
    assert all(m <= x for m, x in zip(means, [v for _, v in by_name[f"train/{MAX}"]], strict=True))

    # 3. The steps changed the weights and the engine serves them: its logprob of a fixed
    # completion matches the trainer's forward pass before and after, and moved with the steps. A
    # step whose group taught nothing leaves the weights as they were, so the first must have
    # taught something; then the second step's rollouts, whose logprobs the proxy captured over
    # HTTP, match the trainer at the first step's weights far closer than the steps moved them.
    if by_name["train/frac_reward_zero_std"][0][1] == 1.0:
        pytest.fail(f"the first step's group taught nothing (all rewards equal)\n{log}")
    check = json.loads((Path(job["run_dir"]) / "logprob_check.json").read_text())
    assert check["engine_vs_trainer_before"] < LOGPROB_TOLERANCE
    assert check["engine_vs_trainer_after"] < LOGPROB_TOLERANCE
    wire_vs_score = max(abs(a - b) for a, b in zip(check["engine_wire"], check["engine_before"], strict=True))
    assert wire_vs_score < LOGPROB_TOLERANCE
    assert check["tensors_changed"] > 0
    second_step_mismatch = by_name[f"train/{MAX}"][1][1]
    assert check["engine_change"] > 20 * max(second_step_mismatch, LOGPROB_TOLERANCE), (check, by_name)

    # 4. The eval ran before the first step and after the last, on the held-out task only.
    evals = by_name["eval/verifier_reward"]
    assert [step for step, _ in evals] == [0, 2] and all(v in (0.0, 1.0) for _, v in evals)
    assert [v for _, v in by_name["eval/n"]] == [1.0, 1.0]
    assert len(by_name["eval/verifier_reward_delta"]) == 1
    # Per step, the task's n is its scorable rollouts (a degenerate one is skipped, not scored 0).
    scorable = [2 * v for _, v in by_name["train/rollout/scorable"]]
    assert [v for _, v in by_name["train/task/reply-fruit/n"]] == scorable
    assert sum("[cpu-grpo] step " in line and "= rollouts" in line for line in lines) == 2
    # A step whose two rollouts were both scorable shares their prompt in the trainer's pass.
    shared = re.search(r"(\d+) row\(s\) scored over their group's shared prompt", log)
    assert shared and int(shared[1]) >= 2 * scorable.count(2.0), log

    # 5. Every rollout was a real tapdeck rollout on the policy engine, captured at the tokens tier,
    # one run per draw, and each turn is stamped with the steps taken before it was sampled: the
    # eval before and the first step's runs 0, the second step's 1, the eval after 2.
    runs = sorted(http.get("/admin/runs").json()["runs"], key=lambda r: r["created_at"])
    redraws = [int(v) for _, v in by_name["train/rollout/redraws"]]
    expected = [0] + [0] * (1 + redraws[0]) + [1] * (1 + redraws[1]) + [2]
    assert len(runs) == len(expected), (runs, redraws)
    for version, run in zip(expected, runs, strict=True):
        held_out = version in (0, 2) and run["plan"]["dataset"] == "learn-eval"
        assert run["plan"]["tasks"] == (["reply-snack"] if held_out else ["reply-fruit"]), run["plan"]
        assert run["plan"]["k"] == (1 if held_out else 2)
        engine = run["plan"]["rollout"]["engine"]
        assert engine.startswith("http://127.0.0.1:") and engine.endswith("/v1")
        rollouts = http.get(f"/admin/runs/{run['id']}").json()["rollouts"]
        assert all(r["tier"] == "tokens" for r in rollouts), rollouts
        for rollout in rollouts:
            session = http.get(f"/admin/sessions/{rollout['session_id']}").json()
            assert session["turns"] >= 1 and session["policy"] == {
                "oldest": version,
                "newest": version,
                "straddled": 0,
            }, session
            trace = http.get(f"/admin/sessions/{rollout['session_id']}/trace").json()
            assert {t["metadata"]["policy_version"] for t in trace["turns"]} == {version}
    engines = http.get("/admin/engines/version").json()["engines"]
    assert [(e["version"], e["source"]) for e in engines] == [(2, "trainer")]
