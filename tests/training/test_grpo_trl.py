"""grpo-trl: imports without trl/torch, parses its options, and its session factory speaks to a REAL
tapdeck server (LocalServer + the embedded engine). The TRL training step itself is not run here:
this machine has no GPU, torch or trl."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tapdeck.runner.recipes.grpo_trl import (
    RolloutUnusable,
    TapdeckSessionFactory,
    arg_parser,
    factory_from_args,
    fetch_trace,
    main,
    task_name,
    vllm_command,
)
from tests.conftest import local_server_on

pytestmark = pytest.mark.slow  # drives the real embedded model and a real Harbor trial


@pytest.fixture(scope="module")
def tapdeck_server(embedded_engine, tmp_path_factory):
    with local_server_on(embedded_engine, tmp_path_factory.mktemp("tapdeck-train-data")) as server:
        yield server


@pytest.mark.parametrize("module", ["trl", "torch", "openenv"])
def test_recipe_imports_and_parses_without_the_training_stack(module: str) -> None:
    code = ("import sys; import tapdeck.runner.recipes.grpo_trl as g; "
            "g.arg_parser().parse_args([]); print(%r in sys.modules)" % module)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_vllm_command_carries_the_flags_trl_and_capture_need(capsys) -> None:
    assert main(["--print-vllm-command", "--model", "Qwen/Qwen3-4B-Instruct-2507"]) == 0
    printed = capsys.readouterr().out
    for flag in ("VLLM_SERVER_DEV_MODE=1", "--logprobs-mode processed_logprobs",
                 "--return-tokens-as-token-ids", "--weight-transfer-config '{\"backend\":\"nccl\"}'",
                 "Qwen/Qwen3-4B-Instruct-2507"):
        assert flag in printed
    assert vllm_command("m")[:3] == ["env", "CUDA_VISIBLE_DEVICES=0", "VLLM_SERVER_DEV_MODE=1"]


def test_options_build_a_picklable_factory_bound_to_trls_sampling(tmp_path: Path) -> None:
    (tmp_path / "admin.key").write_text("k-123\n")
    args = arg_parser().parse_args(["--data-dir", str(tmp_path), "--vllm-url", "http://gpu:8000/",
                                    "--model", "Qwen/Qwen3.5-2B", "--tasks", "hello-file", "greet-script"])
    assert args.num_generations == 8 and args.max_staleness == 4 and args.tasks == ["hello-file", "greet-script"]
    factory = factory_from_args(args)
    assert factory.admin_key == "k-123" and factory.engine == "http://gpu:8000/v1"
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0,
                "presence_penalty": 0.0, "repetition_penalty": 1.0}
    bound = pickle.loads(pickle.dumps(factory))(sampling=sampling)
    assert bound.sampling == sampling and factory.sampling is None
    assert pickle.loads(pickle.dumps(bound)) == bound
    with pytest.raises(ValueError, match="non-neutral"):
        factory(sampling=dict(sampling, top_p=0.9))
    assert bound.plan("hello-file")["tasks"] == ["hello-file"] and bound.plan("x")["k"] == 1


def test_task_names_come_from_strings_rows_or_chat_prompts() -> None:
    assert task_name("hello-file") == "hello-file"
    assert task_name({"prompt": "greet-script"}) == "greet-script"
    assert task_name([{"role": "user", "content": " sum-numbers "}]) == "sum-numbers"
    with pytest.raises(TypeError):
        task_name(42)


def test_session_runs_one_rollout_through_the_server_and_reports_its_reward(tapdeck_server) -> None:
    factory = TapdeckSessionFactory(server=tapdeck_server.url, admin_key=tapdeck_server.admin_key,
                                    harness="oracle", timeout_s=120, poll_s=0.2)(sampling={"temperature": 1.0})
    session = pickle.loads(pickle.dumps(factory)).create("hello-file", seed=3, episode_id="ep-1")
    try:
        assert session.wait_for_completion() == 0  # the oracle makes no model calls
        verdict = session.verify([])
        assert verdict.env_reward == 1.0 and verdict.done
        assert verdict.artifacts["run_id"] == session.run_id
        # Nothing was captured: TRL must see an unscorable rollout, never a contract error.
        with pytest.raises(RolloutUnusable, match="no capture session"):
            session.fetch_training_trace()
    finally:
        session.close()
        session.close()
    run = httpx.get(f"{tapdeck_server.url}/admin/runs/{session.run_id}",
                    headers={"Authorization": f"Bearer {tapdeck_server.admin_key}"}).json()
    assert run["plan"]["harness"] == "oracle" and run["plan"]["tasks"] == ["hello-file"]


def test_unknown_task_is_refused_as_an_unusable_rollout(tapdeck_server) -> None:
    factory = TapdeckSessionFactory(server=tapdeck_server.url, admin_key=tapdeck_server.admin_key,
                                    harness="oracle", poll_s=0.2)
    try:
        session = factory.create("no-such-task")
    except RolloutUnusable as exc:
        assert "no-such-task" in str(exc)
        return
    try:
        session.wait_for_completion()
        assert session.verify().env_reward is None
    finally:
        session.close()


def test_trace_of_a_real_capture_passes_the_trainer_checks(tapdeck_server) -> None:
    admin = httpx.Client(base_url=tapdeck_server.url, timeout=120,
                         headers={"Authorization": f"Bearer {tapdeck_server.admin_key}"})
    with admin:
        info = admin.post("/admin/sessions", json={"rollout_type": "train"}).json()
        assert info["tier"] == "tokens", info
        reply = httpx.post(f"{info['base_urls']['openai']}/chat/completions", timeout=120,
                           headers={"Authorization": f"Bearer {info['api_key']}"},
                           json={"model": "smollm2", "max_tokens": 6, "temperature": 1.0,
                                 "messages": [{"role": "user", "content": "Say hi."}]})
        assert reply.status_code == 200, reply.text
        trace = fetch_trace(admin, info["id"])
        (turn,) = trace["turns"]
        n = len(turn["prompt_token_ids"])
        assert len(turn["loss_mask"]) == n + len(turn["completion_token_ids"])
        assert len(turn["per_token_logps"]) == len(turn["completion_token_ids"]) > 0
        assert turn["node_id"] == "0"
        with pytest.raises(RolloutUnusable):
            fetch_trace(admin, "s-does-not-exist")
