"""Engine resolution, error classification and run bookkeeping (no server needed)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.runner import plan_resolution
from tapdeck.runner.batch import (
    BatchRunner,
    RunPlan,
    _Run,
    summarize,
)
from tapdeck.runner.engines import (
    EngineChoiceError,
    normalize_engine_url,
    resolve_engine,
)
from tapdeck.runner.errors import PlanError, RunUnreadable
from tapdeck.runner.rollout import RolloutResult, classify_exception
from tapdeck.runner.run_dir import PLAN, load_results, rollout_id

DEFAULT = EngineSpec(url="http://127.0.0.1:9/v1", model="smollm2")


def test_embedded_engine_is_the_servers_default_engine() -> None:
    assert resolve_engine(None, default=DEFAULT) is DEFAULT
    assert resolve_engine("embedded", default=DEFAULT) is DEFAULT


def test_engine_parsers_ride_with_the_engine_choice() -> None:
    hermes = DEFAULT.model_copy(update={"tool_call_parser": "hermes"})
    assert resolve_engine("embedded", default=hermes).tool_call_parser == "hermes"
    url = resolve_engine("http://gpu:8000", default=hermes)
    assert (url.tool_call_parser, url.reasoning_parser) == (None, None)  # not the default's
    spec = resolve_engine("http://gpu:8000", tool_parser="hermes", reasoning_parser="qwen3")
    assert (spec.tool_call_parser, spec.reasoning_parser) == ("hermes", "qwen3")
    again = resolve_engine(None, default=hermes, reasoning_parser="qwen3")
    assert (again.url, again.tool_call_parser, again.reasoning_parser) == (DEFAULT.url, "hermes", "qwen3")


def test_embedded_without_a_running_engine_says_what_to_do() -> None:
    with pytest.raises(EngineChoiceError, match="--engine URL"):
        resolve_engine("embedded", default=None)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("gpu-box:8000", "http://gpu-box:8000"),
        ("http://gpu-box:8000/", "http://gpu-box:8000"),
        ("https://api.example.com/v1/", "https://api.example.com/v1"),
    ],
)
def test_engine_urls_get_a_scheme_and_keep_their_path_for_the_proxy_to_settle(
    given: str, expected: str
) -> None:
    assert normalize_engine_url(given) == expected


def test_url_engine_carries_model_and_key_but_never_shows_the_key() -> None:
    spec = resolve_engine("http://gpu:8000", model="qwen", api_key="sk-real", default=DEFAULT)
    assert (spec.url, spec.model, spec.api_key) == ("http://gpu:8000", "qwen", "sk-real")
    assert "sk-real" not in repr(spec)


def test_url_engine_without_a_key_takes_the_engine_api_key_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("TAPDECK_ENGINE_API_KEY", "sk-from-env")
    assert resolve_engine("http://gpu:8000", default=DEFAULT).api_key == "sk-from-env"
    assert resolve_engine("http://gpu:8000", api_key="sk-given", default=DEFAULT).api_key == "sk-given"


def test_bad_engine_url_is_refused() -> None:
    with pytest.raises(EngineChoiceError):
        resolve_engine("ftp://nowhere", default=DEFAULT)


@pytest.mark.parametrize(
    ("exception_type", "phase", "kind"),
    [
        ("AgentTimeoutError", "agent", "agent_timeout"),
        ("RewardFileNotFoundError", "verify", "verifier_failed"),
        ("VerifierOutputParseError", "verify", "verifier_failed"),
        ("EnvironmentStartTimeoutError", "sandbox", "sandbox_failed"),
        ("FileNotFoundError", "sandbox", "sandbox_failed"),
        ("RuntimeError", "agent_setup", "sandbox_failed"),
        ("APIConnectionError", "agent", "engine_unreachable"),
        ("InternalServerError", "agent", "engine_unreachable"),
        ("CancelledError", "agent", "cancelled"),
        ("ValueError", "agent", "agent_failed"),
    ],
)
def test_exceptions_are_classified_by_type_then_phase(exception_type: str, phase: str, kind: str) -> None:
    assert classify_exception(exception_type, phase) == kind  # type: ignore[arg-type]


def test_results_written_with_rendered_findings_load_structured() -> None:
    stored = RolloutResult.model_validate(
        {"rollout_id": "r", "task": "t", "findings": ["[FATAL] bad_ids: negative id at 3"]}
    )
    [f] = stored.findings
    assert (f.level.value, f.code, f.detail) == ("FATAL", "bad_ids", "negative id at 3")


def _result(run_id: str, i: int, *, ok: bool, reward: float | None, kind: str | None = None) -> RolloutResult:
    return RolloutResult(
        rollout_id=rollout_id(run_id, 0, i),
        run_id=run_id,
        task="t",
        index=i,
        ok=ok,
        reward=reward,
        error_kind=kind,
        phase="done" if ok else "failed",
    )


def test_summary_counts_mean_reward_over_graded_and_failures_by_cause(tmp_path: Path) -> None:
    run = _Run("r", tmp_path, RunPlan(k=4), [{"name": "t", "path": "/x"}], 0.0, [])
    for r in (
        _result("r", 0, ok=True, reward=1.0),
        _result("r", 1, ok=True, reward=0.0),
        _result("r", 2, ok=False, reward=None, kind="timeout"),
    ):
        run.results[r.rollout_id] = r
    s = summarize(run)
    counts = {"total": 4, "done": 3, "ok": 2, "failed": 1, "running": 0, "degenerate": 0}
    assert s.counts.model_dump() == counts
    assert s.mean_reward == 0.5  # the null reward is not a 0
    assert s.pass_rate == 0.5  # full reward over graded: the timeout is a failure, not a miss
    assert s.failures == {"timeout": 1}


def test_results_file_with_a_torn_last_line_loads_the_complete_ones(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(_result("r", 0, ok=True, reward=1.0).model_dump_json() + '\n{"rollout_id": "r.g0')
    assert list(load_results(path)) == [rollout_id("r", 0, 0)]


async def test_unknown_task_is_refused_listing_the_tasks(tmp_path: Path) -> None:
    batch = BatchRunner(None, data_dir=tmp_path, default_engine=None)
    with pytest.raises(PlanError, match="hello-file"):
        await batch.create(RunPlan(harness="oracle", tasks=["no-such-task"]))
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


async def test_unknown_harness_is_refused(tmp_path: Path) -> None:
    batch = BatchRunner(None, data_dir=tmp_path, default_engine=None)
    with pytest.raises(PlanError, match="unknown harness"):
        await batch.create(RunPlan(harness="no-such-harness"))


async def test_a_plan_of_more_rollouts_than_a_run_may_have_is_refused_with_the_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plan_resolution, "MAX_ROLLOUTS", 3)  # the real bound needs 98 tasks
    batch = BatchRunner(None, data_dir=tmp_path, default_engine=None)
    with pytest.raises(PlanError) as refused:
        await batch.create(RunPlan(harness="oracle", tasks=["hello-file"], k=4))
    assert str(refused.value) == (
        "1 task(s) × k 4 is 4 rollouts, more than the 3 a run may have; run fewer tasks or a smaller k"
    )
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{not json", "JSONDecodeError: Expecting property name enclosed in double quotes"),
        (b"", "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"),
        (b"\xff\xfe{}", "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff"),
        (b'{"plan": {}}', "ValueError: no tasks, created_at"),
        (b"[]", "ValueError: no plan, tasks, created_at"),
        (b'{"plan": {"k": "many"}, "tasks": [], "created_at": 0}', "plan.k: Input should be a valid integer"),
        (b'{"plan": {}, "tasks": ["t"], "created_at": 0}', "ValueError: tasks is not a list of {name, path}"),
    ],
    ids=["not-json", "empty", "not-utf8", "keys-missing", "not-an-object", "bad-plan", "bad-tasks"],
)
async def test_a_run_whose_plan_file_cannot_be_read_is_refused_naming_it_and_left_out_of_the_list(
    content: bytes, why: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    written = BatchRunner(None, data_dir=tmp_path, default_engine=None)
    good, bad = [(await written.create(RunPlan(harness="oracle", tasks=["hello-file"]))).id for _ in range(2)]
    plan = tmp_path / "runs" / bad / PLAN
    plan.write_bytes(content)
    restarted = BatchRunner(None, data_dir=tmp_path, default_engine=None)
    with pytest.raises(RunUnreadable) as refused:
        restarted.get(bad)
    assert str(refused.value).startswith(f"{plan} is not a readable plan ({why}")
    assert "\n" not in str(refused.value)
    with caplog.at_level(logging.WARNING, logger="tapdeck.runner"):
        assert [s.id for s in restarted.list()] == [good]
        assert [s.id for s in restarted.list()] == [good]
    # Said once, though the list is polled.
    assert [r.getMessage() for r in caplog.records] == [f"run {bad} left out of the list: {refused.value}"]


@pytest.mark.parametrize(
    "agent_kind", ["agent_failed", None], ids=["exited-nonzero", "exited-0-without-turns"]
)
async def test_agent_whose_engine_died_is_classified_engine_unreachable(
    tmp_path: Path, agent_kind: str | None
) -> None:
    # An installed agent that exits non-zero (or exits 0 having captured nothing, as gemini-cli
    # did) after the proxy answered its calls with 502: the session's finding names the cause.
    from tapdeck.proxy.service import CaptureService
    from tapdeck.proxy.sessions.spec import SessionSpec
    from tapdeck.proxy.store.database import Store
    from tapdeck.runner.rollout import RolloutSpec, _finish

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    store = Store(tmp_path / "capture.db")
    service = CaptureService(store, default_engine=EngineSpec(url=dead, model="m"), public_url="http://x")
    try:
        info = await service.open_session(SessionSpec())
        reply = await service.handle_call(
            "/v1/chat/completions",
            {},
            {"authorization": f"Bearer {info.api_key}"},
            b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
        )
        assert reply.status == 502
        result = RolloutResult(
            rollout_id="r-0",
            task="t",
            session_id=info.id,
            error_kind=agent_kind,
            error="the agent exited with 1" if agent_kind else None,
        )
        spec = RolloutSpec(task="t", task_path=tmp_path, trials_dir=tmp_path)
        await _finish(service, spec, result, None, None, [], uses_model=True)
        assert (result.ok, result.error_kind) == (False, "engine_unreachable")
        assert "unreachable" in (result.error or "")
    finally:
        await service.aclose()
        store.close()


@pytest.mark.parametrize(
    ("limit", "source", "asked", "sent", "sampled", "kind"),
    [
        (256, "harness-default", 256, 256, 256, "output_cap"),  # configured into the agent too
        (128, "default", None, 128, 128, "output_cap"),  # codex asked for none; 128 cut it
        (1024, "plan", None, 1024, 1024, "output_cap"),  # the operator's limit, however long
        (None, "default", 32000, 8192, 8192, "output_cap"),  # the proxy's cap under the agent's ask
        (None, "default", None, 8192, 8192, "output_cap"),  # the agent asked for none: the proxy's
        # The embedded engine's runaway bound: a reply the model never ends, not an answer cut short.
        (512, "harness-default", None, 512, 512, "model_output"),
        (None, "default", 2048, 2048, 2048, "model_output"),  # the agent's own 2,048, run through
        (None, "default", 2048, 2048, 5, "agent_failed"),  # cut short of any limit: not a limit's
    ],
)
def test_an_agent_failing_on_a_cut_reply_blames_whose_limit_cut_it(
    limit: int | None, source: str, asked: int | None, sent: int, sampled: int, kind: str
) -> None:
    from tapdeck.runner.rollout import _blame_a_cut_reply
    from tapdeck.schema.settings import ResolvedSettings

    settings = ResolvedSettings(
        context_tokens=32768,
        context_source="engine",
        max_output_tokens=limit,
        max_output_source=source,
        max_turns=3,  # type: ignore[arg-type]
        max_turns_source="default",
        agent_timeout_s=900.0,
        agent_timeout_source="harness-default",
        hard_limit_s=1020.0,
        hard_limit_source="default",
    )
    result = RolloutResult(
        rollout_id="r",
        task="t",
        harness="codex",
        settings=settings,
        error_kind="agent_failed",
        error="codex exited with 1: ERROR: Incomplete",
    )
    requested = {"max_tokens": asked} if asked is not None else {}
    turns = [
        {"seq": 0, "role": "agent", "finish_reason": "stop", "sampled_len": 9},
        {"seq": 1, "role": "auxiliary", "finish_reason": "stop", "sampled_len": 3},
        {
            "seq": 2,
            "role": "agent",
            "finish_reason": "length",
            "sampled_len": sampled,
            "sampling": {"requested": requested, "submitted": {"max_tokens": sent}},
        },
    ]
    _blame_a_cut_reply(result, {"turns": turns})
    assert result.error_kind == kind
    assert result.error.endswith("codex exited with 1: ERROR: Incomplete")
    if kind == "output_cap":
        assert "--max-output-tokens raises it" in result.error
        assert (
            f"the {limit}-token output limit ({source})"
            if limit
            else f"{sent} output tokens, the proxy's cap"
        ) in result.error


async def test_a_templates_loss_mask_threshold_reaches_its_session_and_the_grade_is_never_cut(
    tmp_path: Path, upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tapdeck.proxy.service import CaptureService
    from tapdeck.proxy.store.database import Store
    from tapdeck.runner import rollout
    from tapdeck.schema.findings import Finding
    from tapdeck.schema.rollout_health import DegenerateReason, degenerate_reasons
    from tapdeck.schema.runs import RolloutTemplate

    store = Store(tmp_path / "capture.db")
    engine = EngineSpec(url=upstream.base_url, model="m")
    service = CaptureService(store, default_engine=engine, public_url="http://x")
    try:
        template = RolloutTemplate(min_loss_mask_fraction=0.25)
        spec = rollout.RolloutSpec(task="t", task_path=tmp_path, trials_dir=tmp_path, rollout=template)
        info = await rollout._open_session(service, spec, "r-0")
        assert service._sessions[info.id].record["min_loss_mask_fraction"] == 0.25
        reply = await service.handle_call(
            "/v1/chat/completions",
            {},
            {"authorization": f"Bearer {info.api_key}"},
            b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
        )
        assert reply.status == 200
        result = RolloutResult(rollout_id="r-0", task="t", session_id=info.id)
        # The grade comes after the one-call WARN: a cut at one finding would drop it.
        monkeypatch.setattr(rollout, "MAX_FINDINGS", 1)
        await rollout._finish(service, spec, result, None, None, [Finding.info("extra")], uses_model=True)
        assert result.tier == "tokens" and result.findings[0].code != "degenerate"
        assert degenerate_reasons(result.findings) == [DegenerateReason.SINGLE_CALL]
        assert result.findings[-1].code == "findings_truncated"
    finally:
        await service.aclose()
        store.close()
