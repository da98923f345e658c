"""Rollout settings: defaults taken from the engine, refusals naming the field, the values and
sources a rollout records, and how they reach the Harbor agent."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tapdeck.runner.batch import RunPlan
from tapdeck.runner.datasets import SAMPLE_DATASET_DIR
from tapdeck.runner.harnesses import RunDefaults, build_agent_pieces
from tapdeck.runner.rollout_settings import (
    DEFAULT_HARD_LIMIT_S,
    MIN_OUTPUT_TOKENS,
    OUTPUT_SHARE,
    SettingsDoNotFit,
    resolve,
)
from tapdeck.schema.runs import RolloutTemplate
from tapdeck.schema.settings import RolloutSettings
from tests.support.vllm_recordings import vllm_fixture

HELLO = SAMPLE_DATASET_DIR / "hello-file"
RECORDED_VLLM_CONTEXT = vllm_fixture("models")["models"]["response"]["data"][0]["max_model_len"]
BASE_URLS = {
    "openai": "http://127.0.0.1:9/v1",
    "anthropic": "http://127.0.0.1:9",
    "google": "http://127.0.0.1:9",
}


def _resolve(
    settings: RolloutSettings | None = None,
    *,
    harness: str = "terminus-2",
    engine_context: int | None = 32768,
    task_path: Path | None = HELLO,
    hard_limit_s: float | None = None,
):
    return resolve(
        settings or RolloutSettings(),
        harness=harness,
        engine_context=engine_context,
        task_path=task_path,
        hard_limit_s=hard_limit_s,
    )


@pytest.mark.parametrize(
    ("context", "output"),
    [
        (131072, 131072 // OUTPUT_SHARE),
        (32768, MIN_OUTPUT_TOKENS),
        (RECORDED_VLLM_CONTEXT, MIN_OUTPUT_TOKENS),
    ],
)
def test_context_comes_from_the_engine_and_output_is_a_share_of_it(context: int, output: int) -> None:
    s = _resolve(engine_context=context)
    assert (s.context_tokens, s.context_source, s.engine_context_tokens) == (context, "engine", context)
    assert (s.max_output_tokens, s.max_output_source) == (output, "default")


def test_an_engine_that_does_not_say_gets_the_stated_fallback() -> None:
    s = _resolve(engine_context=None)
    assert (s.context_tokens, s.context_source, s.engine_context_tokens) == (8192, "default", None)


def test_output_tokens_that_do_not_fit_the_engine_are_refused_naming_the_field() -> None:
    with pytest.raises(SettingsDoNotFit) as err:
        _resolve(RolloutSettings(max_output_tokens=20000), engine_context=32768)
    assert err.value.field == "max_output_tokens" and "32768" in str(err.value)


def test_a_context_beyond_the_engines_is_refused_naming_the_field() -> None:
    with pytest.raises(SettingsDoNotFit) as err:
        _resolve(RolloutSettings(context_tokens=65536), engine_context=RECORDED_VLLM_CONTEXT)
    assert err.value.field == "context_tokens"
    smaller = _resolve(RolloutSettings(context_tokens=1024), engine_context=32768)
    assert (smaller.context_tokens, smaller.context_source) == (1024, "plan")


def test_a_harness_whose_first_prompt_cannot_fit_is_refused() -> None:
    # codex's first prompt was 8.7k tokens here: the recorded vLLM's 2048 cannot hold it.
    with pytest.raises(SettingsDoNotFit, match="codex's first prompt") as err:
        _resolve(harness="codex", engine_context=RECORDED_VLLM_CONTEXT)
    assert err.value.field == "context_tokens"
    assert _resolve(harness="codex", engine_context=32768).context_tokens == 32768


def test_a_lean_tool_profile_fits_where_the_full_first_prompt_does_not() -> None:
    # claude-code's full first prompt (12.4k) needs more than 8k; lean (4.2k) fits with 2k output.
    with pytest.raises(SettingsDoNotFit, match="claude-code's first prompt"):
        _resolve(harness="claude-code", engine_context=8192)
    lean = _resolve(
        RolloutSettings(harness_kwargs={"tool_profile": "lean"}), harness="claude-code", engine_context=8192
    )
    assert lean.context_tokens == 8192 and lean.harness_kwargs == {"tool_profile": "lean"}


def test_timeouts_in_force_say_where_they_came_from(tmp_path: Path) -> None:
    task_set = _resolve()
    assert (task_set.agent_timeout_s, task_set.agent_timeout_source) == (180.0, "task")
    assert (task_set.hard_limit_s, task_set.hard_limit_source) == (DEFAULT_HARD_LIMIT_S, "default")
    plan_set = _resolve(RolloutSettings(agent_timeout_s=42), hard_limit_s=90)
    assert (plan_set.agent_timeout_s, plan_set.agent_timeout_source) == (42, "plan")
    assert (plan_set.hard_limit_s, plan_set.hard_limit_source) == (90, "plan")
    (tmp_path / "task.toml").write_text('schema_version = "1.4"\n[verifier]\ntimeout_sec = 60.0\n')
    unset = _resolve(task_path=tmp_path)
    assert (unset.agent_timeout_s, unset.agent_timeout_source) == (None, "none")
    assert unset.timeouts_line() == "agent none (none) · hard limit 300 s (default)"


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"max_turns": 0}, "max_turns"),
        ({"agent_timeout_s": -1}, "agent_timeout_s"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 5}, "max_tokens"),
    ],
)
def test_bad_values_are_refused_with_the_field_named(settings: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        RunPlan.model_validate({"settings": settings})
    assert err.value.errors()[0]["loc"] == ("rollout", "settings", field)


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_a_hard_limit_that_is_not_finite_is_refused_for_api_callers_too(value: float) -> None:
    with pytest.raises(ValidationError) as err:
        RunPlan.model_validate({"rollout": {"timeout_s": value}})
    assert err.value.errors()[0]["loc"] == ("rollout", "timeout_s")


def test_a_settings_temperature_that_contradicts_the_trainers_is_refused() -> None:
    with pytest.raises(ValidationError, match="settings.temperature"):
        RunPlan(settings=RolloutSettings(temperature=0.7), training_sampling={"temperature": 1.0})


def test_old_plans_agent_kwargs_and_agent_timeout_fold_into_settings() -> None:
    plan = RunPlan.model_validate(
        {"agent_kwargs": {"max_turns": 2, "llm_kwargs": {"max_tokens": 16}}, "agent_timeout_s": 30}
    )
    assert plan.rollout.settings == RolloutSettings(
        max_turns=2, agent_timeout_s=30, harness_kwargs={"llm_kwargs": {"max_tokens": 16}}
    )
    assert RunPlan.model_validate(plan.model_dump(mode="json")) == plan


def test_terminus2_is_told_the_engines_context_and_the_sampling() -> None:
    s = _resolve(RolloutSettings(temperature=0.6, top_p=0.9), engine_context=131072)
    defaults = RunDefaults(
        context_tokens=s.context_tokens,
        max_output_tokens=s.max_output_tokens,
        max_turns=s.max_turns,
        agent_timeout_s=s.agent_timeout_s,
        sampling=s.sampling,
    )
    pieces = build_agent_pieces(
        "terminus-2", base_urls=BASE_URLS, session_key="k", served_model="m", defaults=defaults
    )
    assert pieces.kwargs["model_info"]["max_input_tokens"] == 131072
    assert pieces.kwargs["model_info"]["max_output_tokens"] == 512
    assert pieces.kwargs["temperature"] == 0.6
    assert pieces.kwargs["llm_kwargs"] == {"max_tokens": 512, "top_p": 0.9, "api_key": "k"}
    assert pieces.override_timeout_sec == 180.0


def test_agent_cli_limits_come_from_the_settings_and_harness_kwargs_win() -> None:
    pieces = build_agent_pieces(
        "mini-swe-agent",
        base_urls=BASE_URLS,
        session_key="k",
        served_model="m",
        defaults=RunDefaults(max_turns=7, context_tokens=65536),
        agent_kwargs={"max_output_tokens": 99},
    )
    assert pieces.kwargs["max_turns"] == 7 and pieces.kwargs["context_tokens"] == 65536
    assert pieces.kwargs["max_output_tokens"] == 99


async def test_settings_that_do_not_fit_fail_the_rollout_before_the_trial(tmp_path: Path) -> None:
    """Against a served engine listing vLLM's recorded `max_model_len` (2048): the session records
    the context, and codex (8.7k-token first prompt) is refused before any trial starts."""
    from tapdeck.proxy.service import CaptureService
    from tapdeck.proxy.store.database import Store
    from tapdeck.proxy.upstream.tiers import EngineSpec
    from tapdeck.runner.rollout import RolloutSpec, run_rollout
    from tests.support.fake_vllm import FakeVllm

    up = FakeVllm().start()
    service = CaptureService(
        Store(tmp_path / "capture.db"), default_engine=None, public_url="http://127.0.0.1:9"
    )
    try:
        spec = RolloutSpec(
            task="hello-file",
            task_path=HELLO,
            trials_dir=tmp_path / "trials",
            rollout=RolloutTemplate(harness="codex"),
            engine=EngineSpec(url=up.base_url),
        )
        result = await run_rollout(service, spec)
        assert not result.ok and result.error_kind == "settings_do_not_fit"
        assert result.error.startswith("setting context_tokens:") and "2048" in result.error
        assert result.trial_dir is None and not (tmp_path / "trials").exists()
        assert service.get(result.session_id).engine.max_model_len == RECORDED_VLLM_CONTEXT
        assert "agent_execution" not in result.timings
    finally:
        await service.aclose()
        up.stop()


@pytest.mark.slow  # a real Harbor trial (terminus-2 on the host sandbox)
def test_terminus2_runs_with_the_served_engines_context_and_the_session_records_it(tmp_path: Path) -> None:
    """Through a real server whose engine lists vLLM's recorded `max_model_len` (2048): terminus-2
    is told 2048 tokens of context and 128 output tokens, asks for 128, and the result and the
    capture session record both."""
    import json
    import sqlite3

    from tests.support.fake_vllm import FakeVllm
    from tests.support.runner_server import runner_server_on

    up = FakeVllm().start()
    try:
        with runner_server_on(up, tmp_path) as server:
            doc = server.run(
                tasks=["hello-file"],
                harness="terminus-2",
                call_budget=2,
                timeout_s=240,
                settings={"max_turns": 1},
            )
            [r] = doc["rollouts"]
            session = server.http.get(f"/admin/sessions/{r['session_id']}").json()
        settings = r["settings"]
        assert settings is not None, (r["error_kind"], r["error"])
        assert (settings["context_tokens"], settings["context_source"]) == (2048, "engine")
        assert (settings["max_output_tokens"], settings["max_turns"]) == (128, 1)
        config = json.loads((Path(r["trial_dir"]) / "config.json").read_text())
        kwargs = config["agent"]["kwargs"]
        assert kwargs["model_info"]["max_input_tokens"] == 2048 and kwargs["max_turns"] == 1
        assert kwargs["llm_kwargs"]["max_tokens"] == 128
        agent_calls = [b for b in up.requests if "hello" in json.dumps(b.get("messages")).lower()]
        assert agent_calls and all(b["max_tokens"] == 128 for b in agent_calls)
        assert session["engine"]["max_model_len"] == 2048
        assert (session["metadata"]["context_tokens"], session["metadata"]["max_output_tokens"]) == (
            2048,
            128,
        )
        # ...and the proxy enforces that limit on the session (an agent may ignore its own).
        with sqlite3.connect(next(tmp_path.rglob("capture.db"))) as db:
            [(record,)] = db.execute("SELECT record FROM sessions WHERE id = ?", (r["session_id"],))
        assert json.loads(record)["max_output_tokens"] == 128
    finally:
        up.stop()


def test_a_flat_plan_as_older_servers_stored_it_reads_as_the_nested_plan() -> None:
    flat = {
        "dataset": "d",
        "k": 2,
        "harness": "codex",
        "sandbox": "docker",
        "timeout_s": 90,
        "call_budget": 4,
        "metadata": {"trl_group_id": 1},
        "agent_kwargs": {"max_turns": 3},
    }
    plan = RunPlan.model_validate(flat)
    assert plan == RunPlan(
        dataset="d",
        k=2,
        rollout=RolloutTemplate(
            harness="codex",
            sandbox="docker",
            timeout_s=90,
            call_budget=4,
            metadata={"trl_group_id": 1},
            settings=RolloutSettings(max_turns=3),
        ),
    )
    assert "harness" not in plan.model_dump() and RunPlan.model_validate(plan.model_dump()) == plan
    # A nested field wins over a flat one given alongside it.
    assert (
        RunPlan.model_validate({"harness": "codex", "rollout": {"harness": "oracle"}}).rollout.harness
        == "oracle"
    )
