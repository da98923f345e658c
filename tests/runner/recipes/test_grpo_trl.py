"""grpo-trl short of the GPU: options, the AsyncGRPO config and worker arguments it builds, the
printed vLLM command, the session factory's plans, and the trace gate in front of TRL.

TRL's own code running these pieces is in test_trl_harness_loop.py (the training environment); the
trainer's weight update and vLLM's NCCL sync are not run anywhere here (no GPU).
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tapdeck.runner.recipes.admin_client import AdminClient
from tapdeck.runner.recipes.grpo_trl import (
    RolloutUnusable,
    arg_parser,
    check_trace,
    config_kwargs,
    dataset_rows,
    eos_token_ids,
    factory_from_args,
    launch_names,
    main,
    posting_versions,
    task_name,
)
from tapdeck.schema.rollout_health import DEFAULT_MIN_LOSS_MASK_FRACTION
from tapdeck.schema.runs import RunPlan
from tests.support.local_server import local_server_on

TRL_SAMPLING = {
    "temperature": 0.8,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
}


@pytest.mark.parametrize("module", ["trl", "torch", "openenv"])
def test_recipe_imports_and_parses_without_the_training_stack(module: str) -> None:
    code = (
        "import sys; import tapdeck.runner.recipes.grpo_trl as g; "
        f"g.arg_parser().parse_args([]); print({module!r} in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_vllm_command_carries_the_flags_trl_and_capture_need(capsys) -> None:
    assert (
        main(["--print-vllm-command", "--model", "Qwen/Qwen3.5-2B", "--tool-call-parser", "qwen3_xml"]) == 0
    )
    printed = capsys.readouterr().out
    for flag in (
        "VLLM_SERVER_DEV_MODE=1",
        "--logprobs-mode processed_logprobs",
        "--return-tokens-as-token-ids",
        '--weight-transfer-config \'{"backend":"nccl"}\'',
        "--enable-auto-tool-choice --tool-call-parser qwen3_xml",
        "Qwen/Qwen3.5-2B",
    ):
        assert flag in printed


def test_run_is_its_own_flag_never_a_prefix_of_run_name() -> None:
    args = arg_parser().parse_args(["--run", "r-20261201-1"])
    assert args.run == "r-20261201-1" and args.run_name is None
    with pytest.raises(SystemExit):
        arg_parser().parse_args(["--run-n", "x"])  # no abbreviations at all


def test_options_build_a_picklable_factory_bound_to_trls_sampling(tmp_path: Path) -> None:
    (tmp_path / "admin.key").write_text("k-123\n")
    args = arg_parser().parse_args(
        [
            "--data-dir",
            str(tmp_path),
            "--vllm-url",
            "http://gpu:8000/",
            "--num-generations",
            "4",
            "--tasks",
            "hello-file",
            "greet-script",
        ]
    )
    assert args.max_staleness == 4 and args.tasks == ["hello-file", "greet-script"]
    # A --run's plan as an older server stored it (flat, with agent_kwargs): read as one template.
    run_plan = RunPlan.model_validate({"harness": "mini-swe-agent", "agent_kwargs": {"max_turns": 3}})
    factory = factory_from_args(args, run_plan)
    assert factory.admin_key == "k-123" and factory.engine == "http://gpu:8000/v1"
    assert factory.harness == "mini-swe-agent" and factory.settings.max_turns == 3
    bound = pickle.loads(pickle.dumps(factory))(sampling=TRL_SAMPLING)
    assert bound.sampling == TRL_SAMPLING and factory.sampling is None
    assert pickle.loads(pickle.dumps(bound)) == bound
    plan = bound.plan("hello-file", seed=5, episode_id="ep-9")
    assert plan.tasks == ["hello-file"] and plan.k == 1
    assert plan.rollout.harness == "mini-swe-agent" and plan.rollout.settings.max_turns == 3
    assert plan.rollout.training_sampling == TRL_SAMPLING
    assert plan.rollout.metadata == {"trl_group_id": 5, "trl_episode_id": "ep-9", "trl_group_size": 4}
    engine = factory_from_args(
        arg_parser().parse_args(["--data-dir", str(tmp_path), "--engine-url", "http://proxy:9/v1"])
    )
    assert engine.engine == "http://proxy:9/v1"


def test_config_carries_the_vllm_url_and_full_vocabulary_sampling(tmp_path: Path) -> None:
    args = arg_parser().parse_args(["--vllm-url", "http://gpu:8000/", "--temperature", "0.8"])
    config = config_kwargs(args, run_name="t-1", output_dir=tmp_path / "ckpt")
    assert config["vllm_server_base_url"] == "http://gpu:8000"
    assert (
        config["temperature"],
        config["top_p"],
        config["top_k"],
        config["min_p"],
        config["repetition_penalty"],
    ) == (0.8, 1.0, 0, None, 1.0)
    assert config["run_name"] == "t-1" and config["output_dir"] == str(tmp_path / "ckpt")
    assert config["report_to"] == "trackio" and config["num_generations"] == 8


def test_each_launch_gets_its_own_run_name_and_output_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("TAPDECK_TRAIN_RUN_ID", raising=False)
    monkeypatch.delenv("TRACKIO_DIR", raising=False)
    first, second = launch_names(None, None), launch_names(None, None)
    assert first[0] != second[0] and first[1] != second[1]
    monkeypatch.setenv("TAPDECK_TRAIN_RUN_ID", "t-20261201-120000-ab12")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "train" / "t-20261201-120000-ab12" / "trackio"))
    assert launch_names(None, None) == (
        "t-20261201-120000-ab12",
        tmp_path / "train" / "t-20261201-120000-ab12" / "checkpoints",
    )


def test_eos_ids_put_the_tokenizers_first_when_the_model_lacks_it() -> None:
    assert eos_token_ids([2, 7], 2) == [2, 7]
    assert eos_token_ids(7, 2) == [2, 7]
    assert eos_token_ids(None, 2) == [2]


def test_task_names_come_from_strings_rows_or_chat_prompts() -> None:
    assert task_name("hello-file") == "hello-file"
    assert task_name({"prompt": "greet-script"}) == "greet-script"
    assert task_name([{"role": "user", "content": " sum-numbers "}]) == "sum-numbers"
    assert [task_name(r["prompt"]) for r in dataset_rows(["a", "b"])] == ["a", "b"]
    with pytest.raises(TypeError):
        task_name(42)


TURN = {
    "node_id": "0",
    "prompt_token_ids": [1, 2],
    "completion_token_ids": [3],
    "per_token_logps": [-0.5],
    "loss_mask": [0, 0, 1],
}


@pytest.mark.parametrize(
    ("result", "trace", "why"),
    [
        (
            {"ok": False, "error_kind": "agent_timeout", "error": "180 s"},
            {"tier": "tokens", "turns": [TURN]},
            "not ok",
        ),
        (  # its findings, structured, name why
            {"ok": False, "findings": [{"level": "FATAL", "code": "no_calls", "detail": "none"}]},
            {"tier": "tokens", "turns": [TURN]},
            r"not ok \(findings: \[FATAL\] no_calls: none\)",
        ),
        (
            {"ok": True, "findings": ["[FATAL] prefix_break: turn 2"]},
            {"tier": "tokens", "turns": [TURN]},
            "FATAL",
        ),
        (  # as the server's JSON carries them
            {"ok": True, "findings": [{"level": "FATAL", "code": "prefix_break", "detail": "turn 2"}]},
            {"tier": "tokens", "turns": [TURN]},
            "FATAL",
        ),
        (
            {"ok": True, "findings": [{"level": "WARN", "code": "degenerate", "detail": "single_call: x"}]},
            {"tier": "tokens", "turns": [TURN]},
            r"degenerate \(single_call\), skipped as unscorable",
        ),
        ({"ok": True}, {"tier": "logprobs", "turns": [TURN]}, "eval only"),
        ({"ok": True}, {"tier": "tokens", "turns": []}, "no agent turn"),
        ({"ok": True}, {"tier": "tokens", "turns": [dict(TURN, loss_mask=[0, 0, 0])]}, "no trained token"),
        ({"ok": True}, {"tier": "tokens", "turns": [dict(TURN, per_token_logps=[None])]}, "no logprob"),
    ],
)
def test_rollouts_trl_must_not_train_on_are_unscorable_not_contract_errors(result, trace, why) -> None:
    with pytest.raises(RolloutUnusable, match=why) as err:
        check_trace({"schema_version": 1, **trace}, {"session_id": "s-1", **result})
    # TRL stops its worker on ValueError/TypeError/KeyError; a RuntimeError only drops the rollout.
    assert not isinstance(err.value, (ValueError, TypeError, KeyError))
    assert check_trace(
        {"schema_version": 1, "tier": "tokens", "session_id": "s", "turns": [TURN]}, {"ok": True}
    ) == {"schema_version": 1, "turns": [TURN]}


def test_degenerate_rollouts_are_counted_as_they_are_skipped() -> None:
    result = {
        "ok": False,  # no trainable token also fails the rollout: it is counted as degenerate all the same
        "session_id": "s-2",
        "findings": [
            {"level": "FATAL", "code": "no_trainable_sequence", "detail": ""},
            {"level": "WARN", "code": "degenerate", "detail": "no_trainable_token: none of 3"},
            {"level": "WARN", "code": "degenerate", "detail": "single_call: one model call"},
        ],
    }
    counts = []
    for _ in range(2):
        with pytest.raises(RolloutUnusable, match=r"degenerate \(no_trainable_token, single_call\)") as err:
            check_trace({"schema_version": 1, "tier": "tokens", "turns": [TURN]}, result)
        counts.append(int(str(err.value).split("; ")[-1].split()[0]))
    assert counts[1] == counts[0] + 1


def test_the_loss_mask_threshold_reaches_each_rollouts_plan(tmp_path: Path) -> None:
    key = tmp_path / "admin.key"
    key.write_text("k")
    args = arg_parser().parse_args(["--data-dir", str(tmp_path), "--min-loss-mask-fraction", "0.3"])
    factory = factory_from_args(args)
    assert factory.plan("hello-file").rollout.min_loss_mask_fraction == 0.3
    default = factory_from_args(arg_parser().parse_args(["--data-dir", str(tmp_path)]))
    assert default.plan("t").rollout.min_loss_mask_fraction == DEFAULT_MIN_LOSS_MASK_FRACTION
    with pytest.raises(SystemExit):
        arg_parser().parse_args(["--min-loss-mask-fraction", "2"])


@pytest.mark.slow  # the embedded model
def test_a_training_session_samples_at_the_trainers_temperature_and_passes_the_gate(
    embedded_engine, tmp_path: Path
) -> None:
    with local_server_on(embedded_engine, tmp_path) as server:
        admin = AdminClient(server.url, server.admin_key, timeout_s=120)
        try:
            opened = httpx.post(
                f"{server.url}/admin/sessions",
                timeout=120,
                headers={"Authorization": f"Bearer {server.admin_key}"},
                json={"rollout_type": "train", "training_sampling": TRL_SAMPLING},
            ).json()
            assert opened["tier"] == "tokens", opened
            reply = httpx.post(
                f"{opened['base_urls']['openai']}/chat/completions",
                timeout=120,
                headers={"Authorization": f"Bearer {opened['api_key']}"},
                json={
                    "model": "smollm2",
                    "max_tokens": 6,
                    "temperature": 0.3,
                    "top_p": 0.5,
                    "messages": [{"role": "user", "content": "Say hi."}],
                },
            )
            assert reply.status_code == 200, reply.text
            trace = admin.trace(opened["id"])
            (turn,) = check_trace(trace, {"ok": True, "session_id": opened["id"]})["turns"]
            sampling = turn["metadata"]["sampling"]
            assert sampling["requested"]["temperature"] == 0.3 and sampling["requested"]["top_p"] == 0.5
            assert sampling["submitted"]["temperature"] == 0.8 and sampling["submitted"]["top_p"] == 1.0
            assert turn["node_id"] == "0" and turn["response"]["choices"][0]["message"]["role"] == "assistant"
            refused = httpx.post(
                f"{server.url}/admin/sessions",
                timeout=60,
                headers={"Authorization": f"Bearer {server.admin_key}"},
                json={"training_sampling": {"temperature": 1.0, "top_p": 0.9}},
            )
            assert refused.status_code == 422 and "top_p" in refused.text
        finally:
            admin.close()


def test_unknown_task_is_refused_at_create_naming_the_task(tmp_path: Path) -> None:
    """Refused when TRL asks for the session, never a run that ends without a reward: the
    factory raises the unscorable-rollout error naming the task, and the server holds no run."""
    from tapdeck.runner.recipes.grpo_trl import TapdeckSessionFactory
    from tests.support.fake_vllm import FakeVllm

    up = FakeVllm().start()
    try:
        with local_server_on(up, tmp_path) as server:
            factory = TapdeckSessionFactory(
                server=server.url, admin_key=server.admin_key, harness="oracle", poll_s=0.2
            )
            with pytest.raises(RolloutUnusable, match="no-such-task") as err:
                factory.create("no-such-task")
            assert "hello-file" in str(err.value)  # the refusal lists the dataset's tasks
            runs = httpx.get(
                f"{server.url}/admin/runs",
                timeout=30,
                headers={"Authorization": f"Bearer {server.admin_key}"},
            ).json()
            assert runs["runs"] == []
    finally:
        up.stop()


def test_every_model_version_trl_announces_is_posted_to_tapdeck_after_the_worker_hears_it() -> None:
    heard: list[tuple[str, Any]] = []

    class Worker:
        def update_model_version(self, model_version: int) -> None:
            heard.append(("worker", model_version))

    class Admin:
        def post_engine_version(self, version: Any, engine: str | None = None) -> None:
            heard.append(("tapdeck", (version, engine)))

        def close(self) -> None:
            heard.append(("closed", None))

    factory = SimpleNamespace(client=Admin)
    worker = posting_versions(Worker(), factory)
    worker.update_model_version(1)
    worker.update_model_version(2)
    assert heard == [
        ("worker", 1),
        ("tapdeck", (1, None)),
        ("closed", None),
        ("worker", 2),
        ("tapdeck", (2, None)),
        ("closed", None),
    ]
