"""Rollout settings: defaults taken from the engine and the harness, refusals naming the field, the
values and sources a rollout records, and how they reach the Harbor agent."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tapdeck.runner.batch import RunPlan
from tapdeck.runner.datasets import SAMPLE_DATASET_DIR
from tapdeck.runner.harnesses import RunDefaults, build_agent_pieces
from tapdeck.runner.rollout_settings import (
    DEFAULT_HARD_LIMIT_S,
    EMBEDDED_DECODE_TOKENS_PER_S,
    EMBEDDED_PREFILL_TOKENS_PER_S,
    HARD_LIMIT_MARGIN_S,
    HARNESS_DEFAULTS,
    PREFILL_SAFETY,
    RUNAWAY_OUTPUT_TOKENS,
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
    embedded: bool = False,
):
    return resolve(
        settings or RolloutSettings(),
        harness=harness,
        engine_context=engine_context,
        task_path=task_path,
        hard_limit_s=hard_limit_s,
        embedded=embedded,
    )


@pytest.mark.parametrize(
    ("harness", "context"),
    [
        (h, c)
        for h in ("terminus-2", "codex", "claude-code", "mini-swe-agent")
        for c in (131072, 32768, RECORDED_VLLM_CONTEXT)
        if HARNESS_DEFAULTS[h].first_prompt_tokens <= c
    ],
)  # the others are refused (below)
def test_on_an_engine_url_the_harness_asks_its_own_output_with_its_full_tools(
    harness: str, context: int
) -> None:
    s = _resolve(harness=harness, engine_context=context)
    assert (s.context_tokens, s.context_source, s.engine_context_tokens) == (context, "engine", context)
    assert (s.max_output_tokens, s.max_output_source) == (None, "default")
    assert (s.agent_timeout_s, s.agent_timeout_source) == (180.0, "task")
    assert (s.hard_limit_s, s.hard_limit_source) == (DEFAULT_HARD_LIMIT_S, "default")
    expected = ("full", "default") if HARNESS_DEFAULTS[harness].lean_first_prompt_tokens else (None, None)
    assert (s.tool_profile, s.tool_profile_source) == expected


@pytest.mark.parametrize("harness", list(HARNESS_DEFAULTS))
def test_on_the_embedded_engine_each_harness_gets_its_row_of_the_table(harness: str) -> None:
    row = HARNESS_DEFAULTS[harness]
    s = _resolve(harness=harness, embedded=True)
    assert (s.max_output_tokens, s.max_output_source) == (row.embedded_output_tokens, "harness-default")
    assert s.tool_profile == row.embedded_tool_profile
    # Long enough for the engine to read the first prompt PREFILL_SAFETY times over (the task's
    # 180 s is not, for any agent CLI), plus every reply the turns hold at the output limit.
    output = row.embedded_output_tokens
    least = (
        PREFILL_SAFETY * row.first_prompt(s.tool_profile) / EMBEDDED_PREFILL_TOKENS_PER_S
        + s.max_turns * row.replies_per_turn * output / EMBEDDED_DECODE_TOKENS_PER_S
    )
    assert s.agent_timeout_s >= least and s.agent_timeout_s >= 180.0
    assert s.agent_timeout_source == ("task" if s.agent_timeout_s == 180.0 else "harness-default")
    assert s.hard_limit_s == max(DEFAULT_HARD_LIMIT_S, s.agent_timeout_s + HARD_LIMIT_MARGIN_S)


def test_the_embedded_defaults_are_what_each_agent_survives() -> None:
    # Where a cut reply is fatal (codex at once, claude-code after 3 resumes) the limit only cuts
    # a runaway reply; the timeout holds a reply at the limit for every turn.
    for name, row in HARNESS_DEFAULTS.items():
        if row.on_cut_reply in ("fatal", "retries"):
            assert row.embedded_output_tokens >= RUNAWAY_OUTPUT_TOKENS, name
    s = _resolve(harness="codex", embedded=True)
    assert s.max_output_tokens == RUNAWAY_OUTPUT_TOKENS
    assert s.agent_timeout_s >= 3 * RUNAWAY_OUTPUT_TOKENS / EMBEDDED_DECODE_TOKENS_PER_S
    # Every agent CLI runs its lean tools there; the task's 180 s gives way to a longer timeout.
    for name, row in HARNESS_DEFAULTS.items():
        if row.lean_first_prompt_tokens is not None:
            s = _resolve(harness=name, embedded=True)
            assert (s.tool_profile, s.tool_profile_source) == ("lean", "harness-default")
            assert (s.agent_timeout_source, s.hard_limit_source) == ("harness-default", "default")
            assert "tools lean (harness-default)" in s.line()


def test_a_longer_task_timeout_and_the_plans_own_values_win_over_the_harness_defaults(tmp_path: Path) -> None:
    (tmp_path / "task.toml").write_text("[agent]\ntimeout_sec = 5000.0\n")
    longer = _resolve(harness="codex", embedded=True, task_path=tmp_path)
    assert (longer.agent_timeout_s, longer.agent_timeout_source) == (5000.0, "task")
    assert longer.hard_limit_s == 5000.0 + HARD_LIMIT_MARGIN_S
    plan = _resolve(
        RolloutSettings(agent_timeout_s=60, max_output_tokens=64, harness_kwargs={"tool_profile": "full"}),
        harness="codex",
        embedded=True,
        hard_limit_s=90,
    )
    assert (plan.agent_timeout_s, plan.agent_timeout_source) == (60, "plan")
    assert (plan.max_output_tokens, plan.max_output_source) == (64, "plan")
    assert (plan.tool_profile, plan.tool_profile_source) == ("full", "plan")
    assert (plan.hard_limit_s, plan.hard_limit_source) == (90, "plan")


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
        RolloutSettings(harness_kwargs={"tool_profile": "lean"}, max_output_tokens=2048),
        harness="claude-code",
        engine_context=8192,
    )
    assert lean.context_tokens == 8192 and lean.harness_kwargs == {"tool_profile": "lean"}
    assert (lean.tool_profile, lean.tool_profile_source) == ("lean", "plan")
    # The embedded engine's default is lean: an 8k one holds claude-code's first prompt.
    assert _resolve(harness="claude-code", engine_context=8192, embedded=True).tool_profile == "lean"


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
    plan_agent = _resolve(RolloutSettings(agent_timeout_s=1000))
    assert (plan_agent.hard_limit_s, plan_agent.hard_limit_source) == (1120, "default")


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
    # No output limit of tapdeck's on an engine URL: terminus-2 asks for none.
    assert pieces.kwargs["model_info"]["max_output_tokens"] == 131072
    assert pieces.kwargs["temperature"] == 0.6
    assert pieces.kwargs["llm_kwargs"] == {"top_p": 0.9, "api_key": "k"}
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
    embedded = build_agent_pieces(
        "codex",
        base_urls=BASE_URLS,
        session_key="k",
        served_model="m",
        defaults=RunDefaults(max_output_tokens=None, tool_profile="lean"),
    )
    assert embedded.kwargs["max_output_tokens"] is None and embedded.kwargs["tool_profile"] == "lean"


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


@pytest.mark.parametrize(
    ("fingerprint", "first_prompt"),
    [
        (
            vllm_fixture("chat_basic")["response"]["system_fingerprint"],  # vllm-0.32.0-…
            HARNESS_DEFAULTS["codex"].first_prompt_tokens,
        ),
        (None, HARNESS_DEFAULTS["codex"].first_prompt_tokens),
        ("tapdeck-embedded-0.1.0", HARNESS_DEFAULTS["codex"].lean_first_prompt_tokens),
    ],
)
async def test_the_embedded_engine_is_known_by_its_replies_however_it_is_reached(
    tmp_path: Path, fingerprint: str | None, first_prompt: int
) -> None:
    """An engine URL whose replies name it tapdeck's embedded engine (`system_fingerprint`, as a
    `tapdeck engine` behind `--engine` does) gets the embedded defaults, as the server's own
    embedded engine does; vLLM's name vLLM. Each listing says 2,048 tokens of context: codex is
    refused before its trial every time, weighed with its lean first prompt only on the embedded one."""
    from tapdeck.proxy.service import CaptureService
    from tapdeck.proxy.store.database import Store
    from tapdeck.proxy.upstream.tiers import EngineSpec
    from tapdeck.runner.rollout import RolloutSpec, run_rollout
    from tests.support.fake_vllm import FakeVllm
    from tests.support.vllm_recordings import vllm_reply_to

    recorded = vllm_fixture("chat_basic")["response"]
    engine = FakeVllm(
        answer=lambda body: (200, {**vllm_reply_to(body, recorded), "system_fingerprint": fingerprint})
    ).start()
    service = CaptureService(
        Store(tmp_path / "capture.db"), default_engine=None, public_url="http://127.0.0.1:9"
    )
    try:
        spec = RolloutSpec(
            task="hello-file",
            task_path=HELLO,
            trials_dir=tmp_path / "trials",
            rollout=RolloutTemplate(harness="codex"),
            engine=EngineSpec(url=engine.base_url),
        )
        result = await run_rollout(service, spec)
        assert result.error_kind == "settings_do_not_fit", (result.error_kind, result.error)
        assert f"codex's first prompt (~{first_prompt} tokens measured)" in result.error
        assert service.get(result.session_id).engine.system_fingerprint == fingerprint
    finally:
        await service.aclose()
        engine.stop()


@pytest.mark.slow  # a real Harbor trial (terminus-2 on the host sandbox)
def test_terminus2_runs_with_the_served_engines_context_and_the_session_records_it(tmp_path: Path) -> None:
    """Through a real server whose engine lists vLLM's recorded `max_model_len` (2048): terminus-2
    is told 2048 tokens of context and the plan's 128 output tokens (an engine URL sets none by
    default), asks for 128, and the result and the capture session record both."""
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
                settings={"max_turns": 1, "max_output_tokens": 128},
            )
            [r] = doc["rollouts"]
            session = server.http.get(f"/admin/sessions/{r['session_id']}").json()
        settings = r["settings"]
        assert settings is not None, (r["error_kind"], r["error"])
        assert (settings["context_tokens"], settings["context_source"]) == (2048, "engine")
        assert (settings["max_output_tokens"], settings["max_turns"]) == (128, 1)
        assert settings["max_output_source"] == "plan"
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
