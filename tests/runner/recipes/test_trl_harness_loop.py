"""TRL's own loop-owning rollout loop drives a real `tapdeck serve`, and trains on exactly the capture.

In the training environment (train_env_scripts/trl_harness_loop.py), TRL 1.16's `_HarnessRolloutLoop`
is built from the kwargs `HarnessRolloutWorker` forwards for grpo-trl's `worker_kwargs(...)` (the
worker's constructor wants vllm importable: that one check is patched and the loop class is driven
directly, as the worker's spawned child would). It runs two groups of two rollouts over the sample
dataset on the host sandbox with terminus-2 and the embedded engine: the first group's task does not
exist (every rollout unscorable, and the loop must keep going), the second is `hello-file`. Here the
samples TRL built are compared, token by token, with what tapdeck captured and graded.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tapdeck.runner.recipes.data_check import group_advantages
from tapdeck.runner.recipes.grpo_trl import RolloutUnusable, check_trace
from tests.support.in_train_env import TRAIN_ENV_SCRIPTS, run_in_train_env
from tests.support.tapdeck_process import tapdeck_serve

pytestmark = pytest.mark.slow  # real trials, the embedded model, torch and TRL (minutes)

SCRIPT = TRAIN_ENV_SCRIPTS / "trl_harness_loop.py"
ADMIN_KEY = "trl-loop-test-admin-key"
TAPDECK = Path(sys.executable).parent / "tapdeck"
# What _AsyncRolloutLoop requires, and what the worker adds itself.
REQUIRED = {
    "model_name",
    "dataset",
    "reward_funcs",
    "processing_class",
    "eos_token_ids",
    "harness_session_factory",
    "queue_maxsize",
    "dataset_start_index",
}


@pytest.fixture(scope="module")
def serve(embedded_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`tapdeck serve` in its own process over the shared embedded engine; its URL."""
    tmp = tmp_path_factory.mktemp("trl-serve")
    with tapdeck_serve(
        TAPDECK,
        tmp / "data",
        tmp / "serve.log",
        admin_key=ADMIN_KEY,
        engine_url=embedded_engine.base_url,
        engine_model=embedded_engine.served_name,
    ) as process:
        yield process.url


def _captured(url: str) -> list[dict[str, Any]]:
    """Every rollout TRL started on the server: its result, session record, trace and rollout document."""
    admin = httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    out = []
    with admin:
        for run in admin.get("/admin/runs").json()["runs"]:
            for result in admin.get(f"/admin/runs/{run['id']}").json()["rollouts"]:
                sid = result.get("session_id")
                entry = {"result": result, "session": None, "trace": None, "doc": None}
                if sid:
                    entry["session"] = admin.get(f"/admin/sessions/{sid}").json()
                    trace = admin.get(f"/admin/sessions/{sid}/trace")
                    entry["trace"] = trace.json() if trace.status_code == 200 else None
                    entry["doc"] = admin.get(f"/admin/sessions/{sid}/rollout").json()
                out.append(entry)
    return out


def _usable(entry: dict[str, Any]) -> bool:
    try:
        check_trace(entry["trace"] or {}, entry["result"])
    except RolloutUnusable:
        return False
    return True


def test_trls_rollout_loop_trains_on_exactly_what_tapdeck_captured(
    train_python: Path, serve: str, tmp_path: Path
) -> None:
    from tapdeck.runner.engine.model_file import default_model_path

    out = tmp_path / "loop.json"
    run_in_train_env(
        train_python,
        SCRIPT,
        serve,
        ADMIN_KEY,
        str(default_model_path()),
        str(out),
        "2",
        "no-such-task",
        "hello-file",
        timeout_s=1800,
    )
    loop = json.loads(out.read_text())
    assert not loop["failed"] and loop["loop_stopped"]
    assert REQUIRED <= set(loop["loop_kwargs"])
    assert loop["fork_threshold"] == 0  # lossless loop-owning mode
    assert loop["vllm_server_url"] == "http://127.0.0.1:9"  # never contacted: nothing listens there
    assert loop["sampling"]["temperature"] == 0.8 and loop["sampling"]["top_p"] == 1.0

    rollouts = _captured(serve)
    # The non-existent task is refused when TRL creates its session: it never becomes a run.
    assert not any(e["result"]["task"] == "no-such-task" for e in rollouts)
    real = [e for e in rollouts if e["session"] and e["session"]["metadata"].get("trl_group_id") == 1]
    assert len(real) == 2, [e["result"] for e in rollouts]
    for e in real:
        meta = e["session"]["metadata"]
        assert meta["trl_group_size"] == 2 and len(meta["trl_episode_id"]) == 32
        for turn in (e["trace"] or {}).get("turns", []):
            assert (
                turn["metadata"]["sampling"]["submitted"]["temperature"] == 0.8
            )  # the trainer's, not the harness's

    # The loop keeps starting groups (the dataset cycles) until it is stopped, so a fast machine
    # scores more than the two asked for: every sample must come from a hello-file group, and the
    # token-by-token comparison is over group 1, whose rollouts are all captured above.
    hello_groups = {
        e["session"]["metadata"]["trl_group_id"]
        for e in rollouts
        if e["session"] and e["result"]["task"] == "hello-file"
    }
    assert {s["group_id"] for s in loop["samples"]} <= hello_groups, (
        "the non-existent task's groups must give no sample"
    )
    samples = [s for s in loop["samples"] if s["group_id"] == 1]
    usable = [e for e in real if _usable(e)]
    assert usable, "no usable rollout of hello-file: " + "; ".join(
        str(e["result"].get("error")) for e in real
    )
    rewards = [e["result"]["reward"] for e in usable]
    advantages = dict(
        zip((e["result"]["session_id"] for e in usable), group_advantages(rewards), strict=True)
    )

    matched = set()
    for e in usable:
        rows = [s for s in e["doc"]["sequences"] if s["role"] == "agent" and any(s["loss_mask"])]
        for row in rows:
            hits = [i for i, s in enumerate(samples) if s["input_ids"] == row["input_ids"]]
            assert len(hits) == 1, "each captured row is exactly one TRL sample"
            s = samples[hits[0]]
            matched.add(hits[0])
            assert s["completion_mask"] == row["loss_mask"]
            trained = np.asarray(row["loss_mask"]) == 1
            assert np.allclose(
                np.asarray(s["old_log_probs"])[trained], np.asarray(row["logprobs"])[trained], atol=1e-6
            )
            expected = advantages[e["result"]["session_id"]]
            assert s["advantage"] == pytest.approx(0.0 if expected is None else expected, abs=1e-9)
            assert s["metrics"]["reward"] == pytest.approx(e["result"]["reward"])
    assert matched == set(range(len(samples))), "every TRL sample is a captured row"

    # Tool counts: TRL reads choices[0].message.tool_calls; tapdeck's captured responses hold the same calls.
    captured_calls = sum(
        len(t["response"]["choices"][0]["message"].get("tool_calls") or [])
        for e in usable
        for t in e["trace"]["turns"]
    )
    trl_calls = sum(
        v
        for m in loop["metrics"]
        for k, v in m.items()
        if k.startswith("tools/") and k.endswith("/call_total")
    )
    assert trl_calls == captured_calls
